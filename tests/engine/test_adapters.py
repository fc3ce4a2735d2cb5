"""engine.adapters: a fine-tune's adapter (mlx_lm.lora's layout) applied at load answers as mlx-lm's own loader with
the same adapter — fused into float weights, live LoRA layers on a quantized base — and through the engine too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio
import numpy as np
import pytest

import engine  # noqa: F401  (fast BLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step
from mlx_lm.utils import load, save_config

from engine.adapters import AdapterError, check_adapter_dir
from engine.contracts import GenerationRequest, SamplingParams
from engine.models import load_model
from engine.runtime import Engine, generate_stream
from tests.fixtures.tiny_adapter import build_tiny_adapter
from tests.fixtures.tiny_llm import build_tiny_llm

TEXT = "Hello world! This is a tiny language model."


def _logits(model: nn.Module, ids: list[int]) -> np.ndarray:
    return np.array(model(mx.array([ids]))[0].astype(mx.float32))


def _wrapped(model: nn.Module) -> list[str]:
    """Names of the LoRA/DoRA layers still in the model."""
    return [name for name, module in model.named_modules() if hasattr(module, "fuse")]


@pytest.fixture(scope="module")
def lora_dir(tiny_llm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_adapter(tiny_llm_dir, tmp_path_factory.mktemp("lora"))


@pytest.fixture(scope="module")
def quantized_dir(tiny_llm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model 8-bit quantized, as `mlx_lm.convert -q` writes it."""
    out = tmp_path_factory.mktemp("q8")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_llm_dir / name, out / name)
    model, _, config = load(str(tiny_llm_dir), return_config=True)
    nn.quantize(model, group_size=32, bits=8)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    save_config({**config, "quantization": {"group_size": 32, "bits": 8}}, out / "config.json")
    return out


@pytest.mark.parametrize("kind", ["lora", "dora"])
def test_an_adapter_on_float_weights_is_fused_and_answers_as_mlx_lm(kind: str, tiny_llm_dir: Path,
                                                                     tmp_path: Path) -> None:
    adapter = build_tiny_adapter(tiny_llm_dir, tmp_path / kind, fine_tune_type=kind)
    loaded = load_model(str(tiny_llm_dir), adapter_path=adapter)
    reference, tokenizer = load(str(tiny_llm_dir), adapter_path=str(adapter))
    base, _ = load(str(tiny_llm_dir))
    ids = tokenizer.encode(TEXT)
    ours = _logits(loaded.model, ids)
    np.testing.assert_allclose(ours, _logits(reference, ids), atol=2e-4)
    assert np.abs(ours - _logits(base, ids)).max() > 0.05  # the adapter changes the answer
    # Fused: the packed pass and the fused kernels see plain Linear layers again.
    assert _wrapped(loaded.model) == [] and _wrapped(reference)
    assert loaded.adapter is not None and (loaded.adapter.kind, loaded.adapter.live) == (kind, 0)
    assert loaded.adapter.fused == len(_wrapped(reference))


def test_a_quantized_base_keeps_live_lora_layers(quantized_dir: Path, tmp_path: Path) -> None:
    # Fusing would re-quantize the small update away with the weight it joins: mlx_lm.server serves it live.
    adapter = build_tiny_adapter(quantized_dir, tmp_path / "lora")
    kept = load_model(str(quantized_dir), float32=False, adapter_path=adapter)
    reference, tokenizer = load(str(quantized_dir), adapter_path=str(adapter))
    ids = tokenizer.encode(TEXT)
    np.testing.assert_allclose(_logits(kept.model, ids), _logits(reference, ids), atol=2e-4)
    assert kept.adapter is not None and kept.adapter.fused == 0 and kept.adapter.live == len(_wrapped(reference))
    assert not kept.model.training  # a live layer's dropout is off
    # On the CPU the base is dequantized to float32 first, so there the update is fused exactly.
    dense = load_model(str(quantized_dir), float32=True, adapter_path=adapter)
    assert _wrapped(dense.model) == []
    np.testing.assert_allclose(_logits(dense.model, ids), _logits(reference, ids), atol=2e-3)


@pytest.mark.parametrize("quantized", [False, True])
def test_the_engine_serves_the_adapted_model_as_mlx_lm_generates(quantized: bool, tiny_llm_dir: Path,
                                                                 quantized_dir: Path, tmp_path: Path) -> None:
    # Through the engine's packed pass (live LoRA layers go through its per-layer fallback).
    base = quantized_dir if quantized else tiny_llm_dir
    adapter = build_tiny_adapter(base, tmp_path / "lora")
    loaded = load_model(str(base), float32=False, adapter_path=adapter)
    reference, tokenizer = load(str(base), adapter_path=str(adapter))
    prompt = tokenizer.encode(TEXT)
    expected = [int(t) for t, _ in generate_step(mx.array(prompt), reference, max_tokens=12)]
    result = anyio.run(generate_stream, Engine(loaded, max_active=2, max_iteration_tokens=8),
                       GenerationRequest(prompt, SamplingParams(temperature=0.0), max_tokens=12), lambda _: None)
    assert result.token_ids == expected[: len(result.token_ids)] and len(result.token_ids) >= 4
    plain, _ = load(str(base))
    assert [int(t) for t, _ in generate_step(mx.array(prompt), plain, max_tokens=12)] != expected


def test_an_adapter_that_is_not_one_is_said_plainly(tiny_llm_dir: Path, lora_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(AdapterError, match="is not a directory"):
        check_adapter_dir(tmp_path / "nowhere")
    partial = Path(shutil.copytree(lora_dir, tmp_path / "partial"))
    (partial / "adapters.safetensors").unlink()
    with pytest.raises(AdapterError, match="has no adapters.safetensors"):
        load_model(str(tiny_llm_dir), adapter_path=partial)
    old = Path(shutil.copytree(lora_dir, tmp_path / "old"))
    config = json.loads((old / "adapter_config.json").read_text())
    config["lora_layers"] = config.pop("num_layers")
    (old / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(AdapterError, match="lacks num_layers"):
        check_adapter_dir(old)
    # An adapter trained for another model: mlx-lm's list of the tensors that do not fit, in one error.
    wider = build_tiny_llm(tmp_path / "wider", hidden_size=96)
    with pytest.raises(AdapterError, match="does not fit this model"):
        load_model(str(tiny_llm_dir), adapter_path=build_tiny_adapter(wider, tmp_path / "wider-lora"))
