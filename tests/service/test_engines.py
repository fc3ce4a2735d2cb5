"""service/engines.py: a model directory with a broken file fails to load with one line naming the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pytest

from service.config import ServiceConfig
from service.engines import ModelFileError, open_engine

if TYPE_CHECKING:
    import mlx.core as mx

pytestmark = pytest.mark.anyio


def _copy(tiny_llm_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_llm_dir, tmp_path / "model"))


async def _load_error(directory: Path) -> str:
    with pytest.raises(ModelFileError) as caught:
        engine = await open_engine(ServiceConfig(model=str(directory)))
        engine.close()
    message = str(caught.value)
    assert "\n" not in message
    return message


async def test_a_config_without_the_model_fields_names_config_json(tiny_llm_dir: Path, tmp_path: Path) -> None:
    # mlx-lm said only "ModelArgs.__init__() missing 5 required positional arguments".
    model = _copy(tiny_llm_dir, tmp_path)
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": "abc"}))
    message = await _load_error(model)
    assert f"{model / 'config.json'} does not describe a usable llama model" in message, message


async def test_a_truncated_config_names_config_json(tiny_llm_dir: Path, tmp_path: Path) -> None:
    model = _copy(tiny_llm_dir, tmp_path)
    (model / "config.json").write_text((model / "config.json").read_text()[:20])
    assert f"{model / 'config.json'} is not valid JSON" in await _load_error(model)


async def test_an_empty_weights_file_is_named(tiny_llm_dir: Path, tmp_path: Path) -> None:
    # mlx said only "[read] Unable to read 8 bytes from file."
    model = _copy(tiny_llm_dir, tmp_path)
    weights = sorted(model.glob("*.safetensors"))[0]
    weights.write_bytes(b"")
    assert f"{weights} is empty (0 bytes)" in await _load_error(model)


async def test_a_truncated_weights_file_is_named(tiny_llm_dir: Path, tmp_path: Path) -> None:
    model = _copy(tiny_llm_dir, tmp_path)
    weights = sorted(model.glob("*.safetensors"))[0]
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    assert f"{weights} is truncated" in await _load_error(model)


def _rewrite_weights(model: Path, change: Callable[[dict[str, mx.array]], dict[str, mx.array]]) -> Path:
    import mlx.core as mx

    weights = model / "model.safetensors"
    mx.save_safetensors(str(weights), change(dict(mx.load(str(weights)))), metadata={"format": "mlx"})
    return weights


async def test_an_extra_tensor_names_the_weights_file_and_the_tensor(tiny_llm_dir: Path, tmp_path: Path) -> None:
    # The message blamed config.json: "config.json does not describe a usable llama model: ValueError: Received 1
    # parameters not in model: unused.foo".
    import mlx.core as mx

    model = _copy(tiny_llm_dir, tmp_path)
    weights = _rewrite_weights(model, lambda w: w | {"unused.foo": mx.zeros((2,))})
    message = await _load_error(model)
    assert message == (f"{weights} holds 1 tensor that the llama model of config.json has no place for: unused.foo"), \
        message


async def test_untied_weights_without_lm_head_name_the_file_and_the_tensor(tiny_llm_dir: Path, tmp_path: Path) -> None:
    model = _copy(tiny_llm_dir, tmp_path)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"tie_word_embeddings": False}))
    weights = _rewrite_weights(model, lambda w: {k: v for k, v in w.items() if not k.startswith("lm_head")})
    message = await _load_error(model)
    assert message.startswith(f"{weights} lacks 1 tensor that the llama model of config.json needs: lm_head.weight "
                              "(config.json has tie_word_embeddings: false"), message


async def test_a_tensor_of_the_wrong_shape_is_named_with_its_file(tiny_llm_dir: Path, tmp_path: Path) -> None:
    import mlx.core as mx

    model = _copy(tiny_llm_dir, tmp_path)
    weights = _rewrite_weights(model, lambda w: w | {"model.norm.weight": mx.ones((3,))})
    message = await _load_error(model)
    assert message.startswith(f"{weights}: tensor model.norm.weight has shape (3,), but the llama model of config.json "
                              "needs ("), message


async def test_a_state_space_checkpoint_loads_with_a_budget_for_its_states(tmp_path: Path) -> None:
    # Mamba has no attention layer to size a KV cache from: it was refused as "config.json does not describe a
    # usable mamba model" although mlx-lm serves it. Its state is fixed a row: a token costs it no KV.
    from tests.engine.test_batch import MAMBA
    from tests.fixtures.tiny_llm import build_tiny_llm

    model = build_tiny_llm(tmp_path / "mamba", model_type="mamba", extra_config=MAMBA)
    engine = await open_engine(ServiceConfig(model=str(model)))
    try:
        budget = engine.memory_stats()["budget"]  # type: ignore[attr-defined]
        assert budget["kv_token_bytes"] == 0 and budget["kv_row_bytes"] == budget["kv_state_bytes"] > 0
        assert engine.max_model_len == engine.context_length  # type: ignore[attr-defined]
    finally:
        engine.close()


async def test_the_adapter_path_is_applied_to_the_served_model(tiny_llm_dir: Path, tmp_path: Path) -> None:
    from engine.adapters import AdapterError
    from tests.fixtures.tiny_adapter import build_tiny_adapter

    adapter = build_tiny_adapter(tiny_llm_dir, tmp_path / "lora")
    engine = await open_engine(ServiceConfig(model=str(tiny_llm_dir), adapter_path=str(adapter)))
    try:
        applied = engine.loaded.adapter  # type: ignore[attr-defined]
        assert applied is not None and applied.path == str(adapter) and applied.fused > 0
    finally:
        engine.close()
    (adapter / "adapters.safetensors").unlink()
    with pytest.raises(AdapterError, match="has no adapters.safetensors"):
        await open_engine(ServiceConfig(model=str(tiny_llm_dir), adapter_path=str(adapter)))


async def test_a_budget_that_cannot_hold_the_model_keeps_its_own_words(tiny_llm_dir: Path) -> None:
    # it was wrapped as "config.json does not describe a usable llama model: ValueError: the memory budget of ..."
    from engine.errors import ModelUnsupported

    with pytest.raises(ModelUnsupported) as caught:
        engine = await open_engine(ServiceConfig(model=str(tiny_llm_dir), memory_budget=1 << 20))
        engine.close()
    message = str(caught.value)
    assert message.startswith("the memory budget of 1 MiB leaves") and "config.json" not in message, message
