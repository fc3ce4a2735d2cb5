"""engine.cpu_weights: the bytes a checkpoint's weights take on the CPU, read from headers before the load, and a
quantized checkpoint kept quantized where its float32 expansion would not fit the memory budget."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import engine  # noqa: F401  (fast BLAS before mlx)
import mlx.nn as nn

from engine.checkpoint_checks import read_config
from engine.contracts import GenerationRequest, SamplingParams
from engine.cpu_weights import room_for, to_float32, weight_sizes
from engine.memory import weight_bytes
from engine.runtime import Engine, generate_stream
from tests.fixtures.quantized_llm import quantize_tiny_llm

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def q4_dir(tiny_llm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return quantize_tiny_llm(tiny_llm_dir, tmp_path_factory.mktemp("q4"))


def test_the_float32_size_is_known_before_the_load(q4_dir: Path) -> None:
    from mlx_lm.utils import load

    sizes = weight_sizes(q4_dir, read_config(q4_dir))
    model, _ = load(str(q4_dir))
    assert sizes.stored == weight_bytes(model)
    to_float32(model)
    # The on-disk size was the budget's measure: a 4-bit file widens ~7x (6x with the 8-bit down_proj).
    assert sizes.float32 == weight_bytes(model) and sizes.float32 > 5 * sizes.stored


async def test_a_budget_too_small_for_float32_keeps_quantized_layers_and_serves(q4_dir: Path, caplog) -> None:
    config = read_config(q4_dir)
    sizes = weight_sizes(q4_dir, config)
    probe = 512 << 20
    shares = probe - room_for(config, probe)  # fixed below 1.28 GB: the buffer cache's floor and activations
    budget = shares + (sizes.stored + sizes.float32) // 2
    assert room_for(config, budget) < sizes.float32 and room_for(config, budget) > sizes.stored
    with caplog.at_level(logging.INFO, logger="engine.cpu_weights"):
        tight = await Engine.open(str(q4_dir), max_active=2, memory_budget=budget, prompt_cache_bytes=0)
    up = tight.loaded.model.model.layers[0].mlp.up_proj
    assert isinstance(up, nn.QuantizedLinear) and up.bits == 4
    assert [r for r in caplog.records if "stay quantized" in r.getMessage()]
    result = await generate_stream(tight, GenerationRequest([5, 6, 7], SamplingParams(temperature=0.0), max_tokens=4))
    assert len(result.token_ids) == 4 and result.error is None
    # With room for float32, the CPU widens as before.
    roomy = await Engine.open(str(q4_dir), max_active=2, memory_budget=budget + sizes.float32, prompt_cache_bytes=0)
    try:
        assert isinstance(roomy.loaded.model.model.layers[0].mlp.up_proj, nn.Linear)
    finally:
        roomy.close()
