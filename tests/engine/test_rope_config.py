"""engine.rope_config through load_model: a transformers-5 config (`rope_parameters`) loads the RoPE its v4 twin does,
and rope_scaling extends the context as vLLM counts it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import engine  # noqa: F401  (fast BLAS before mlx)
import mlx.core as mx

from engine.errors import ModelUnsupported
from engine.models import load_model
from engine.rope_config import rope_overrides
from tests.fixtures.tiny_llm import build_tiny_llm

_LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def _logits(loaded, text: str = "Hello world! What is the answer? The quick brown fox") -> np.ndarray:
    ids = loaded.tokenizer.encode(text)
    return np.array(loaded.model(mx.array([ids]))[0].astype(mx.float32))


def _v5_twin(v4: Path, target: Path, rope_parameters: dict, drop: tuple[str, ...]) -> Path:
    """`v4`'s weights with its config as transformers 5 saves it: rope_parameters, no rope_theta/rope_scaling."""
    shutil.copytree(v4, target)
    config = json.loads((v4 / "config.json").read_text())
    for key in drop:
        config.pop(key, None)
    (target / "config.json").write_text(json.dumps({**config, "rope_parameters": rope_parameters}))
    return target


@pytest.fixture(scope="module")
def llama3_v4(tmp_path_factory) -> Path:
    # Llama 3.x's RoPE: theta 500,000 and llama3 scaling; the prompt is past original_max_position_embeddings / 4,
    # where the scaling changes the frequencies.
    return build_tiny_llm(tmp_path_factory.mktemp("v4"), extra_config={
        "rope_theta": 500000.0, "max_position_embeddings": 512, "rope_scaling": {"rope_type": "llama3", **_LLAMA3}})


def test_a_transformers_5_config_loads_the_rope_of_its_v4_twin(llama3_v4, tmp_path) -> None:
    v5 = _v5_twin(llama3_v4, tmp_path / "v5", {"rope_type": "llama3", "rope_theta": 500000.0, **_LLAMA3},
                  drop=("rope_theta", "rope_scaling"))
    four, five = load_model(str(llama3_v4)), load_model(str(v5))
    # It loaded with theta 10,000 and no llama3 scaling: the logits differed by whole units.
    np.testing.assert_array_equal(_logits(four), _logits(five))
    assert five.model.model.layers[0].self_attn.rope.__class__.__name__ == "Llama3RoPE"


def test_a_default_rope_type_is_no_scaling_and_its_theta_is_read(tmp_path) -> None:
    v4 = build_tiny_llm(tmp_path / "v4", extra_config={"rope_theta": 250000.0})
    v5 = _v5_twin(v4, tmp_path / "v5", {"rope_type": "default", "rope_theta": 250000.0}, drop=("rope_theta",))
    assert rope_overrides(json.loads((v5 / "config.json").read_text())) == {"rope_theta": 250000.0}
    np.testing.assert_array_equal(_logits(load_model(str(v4))), _logits(load_model(str(v5))))


def test_gemma3s_per_layer_type_form_maps_to_its_local_base_freq(tmp_path) -> None:
    gemma = {"architectures": ["Gemma3ForCausalLM"], "sliding_window": 16, "sliding_window_pattern": 2,
             "query_pre_attn_scalar": 16, "num_hidden_layers": 2}
    v4 = build_tiny_llm(tmp_path / "v4", model_type="gemma3_text", extra_config={
        **gemma, "rope_theta": 1_000_000.0, "rope_local_base_freq": 20000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0}})
    v5 = _v5_twin(v4, tmp_path / "v5", {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}},
        drop=("rope_theta", "rope_local_base_freq", "rope_scaling"))
    np.testing.assert_array_equal(_logits(load_model(str(v4))), _logits(load_model(str(v5))))


def test_a_rope_parameters_form_that_maps_to_nothing_is_refused_by_name(tmp_path) -> None:
    odd = {"model_type": "llama", "rope_parameters": {"chunked_attention": {"rope_type": "default"}}}
    with pytest.raises(ModelUnsupported, match="rope_parameters"):
        rope_overrides(odd)
    sliding_yarn = {"model_type": "gemma3_text", "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}}}
    with pytest.raises(ModelUnsupported, match="rope_parameters.sliding_attention"):
        rope_overrides(sliding_yarn)


def test_a_module_that_reads_rope_parameters_itself_is_left_alone() -> None:
    # mlx-lm's qwen3 reads rope_parameters (and prefers the top-level fields): nothing to add.
    assert rope_overrides({"model_type": "qwen3", "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}) == {}


@pytest.mark.parametrize("scaling,context", [
    # Qwen2.5/Qwen3's model cards: yarn, factor 4 over the original 32,768 -> 131,072 (here over 256).
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}, 1024),
    ({"type": "linear", "factor": 4.0}, 1024),
    ({"type": "dynamic", "factor": 2.0}, 512),
    ({"rope_type": "llama3", **_LLAMA3}, 256),  # llama3 already counts it in max_position_embeddings
])
def test_rope_scaling_extends_the_context_as_vllm_counts_it(tmp_path, scaling: dict, context: int) -> None:
    directory = build_tiny_llm(tmp_path / "m", extra_config={"max_position_embeddings": 256, "rope_scaling": scaling})
    # It stayed at max_position_embeddings (256), refusing longer prompts.
    assert load_model(str(directory)).context_length == context


def _mixtral(tmp_path: Path, scaling: dict) -> Path:
    return build_tiny_llm(tmp_path / "mixtral", model_type="mixtral", extra_config={
        "architectures": ["MixtralForCausalLM"], "num_local_experts": 2, "num_experts_per_tok": 1,
        "max_position_embeddings": 256, "rope_scaling": scaling})


@pytest.mark.parametrize("kind, scaling", [
    ("linear", {"type": "linear", "factor": 2.0}),
    ("yarn", {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 8}),  # trained: 8 x 32 = 256
])
def test_a_trained_scaling_the_model_module_drops_is_refused_by_name(tmp_path, kind: str, scaling: dict) -> None:
    # mlx-lm's mixtral (and qwen3_moe) take rope_scaling and never use it: plain RoPE was served.
    with pytest.raises(ModelUnsupported, match=f"rope_scaling asks for {kind} RoPE"):
        load_model(str(_mixtral(tmp_path, scaling)))


@pytest.mark.parametrize("scaling", [{"type": "dynamic", "factor": 2.0},
                                     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}])
def test_an_extension_the_model_module_drops_is_served_within_the_native_context(
        tmp_path, scaling: dict, caplog: pytest.LogCaptureFixture) -> None:
    # Qwen3-MoE's card adds yarn (4 x 32,768) to a model trained with plain RoPE; mlx_lm.server serves it: refusing to
    # start left the user no server. Within max_position_embeddings plain RoPE is what the model learnt.
    with caplog.at_level("WARNING", logger="engine.rope_config"):
        assert load_model(str(_mixtral(tmp_path, scaling))).context_length == 256
    assert any("served with plain RoPE within its max_position_embeddings, 256 tokens" in r.getMessage()
               for r in caplog.records)
