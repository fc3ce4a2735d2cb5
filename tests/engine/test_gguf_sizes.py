"""engine.gguf_sizes: a GGUF's converted size in both forms, read from its header before any conversion, and the CPU's
choice between them: float32 where it fits the memory budget, the file's quantized tensors kept where only they fit,
a refusal before anything is written where neither does; and a conversion refused before it writes on a full disk."""

from __future__ import annotations

import logging
from collections import namedtuple
from pathlib import Path

import pytest

import engine  # noqa: F401  (fast BLAS before mlx)
import mlx.core as mx
import mlx.nn as nn

from engine.contracts import GenerationRequest, SamplingParams
from engine.cpu_weights import room_for
from engine.errors import ModelUnsupported
from engine.gguf import convert_gguf
from engine.gguf_header import read_header
from engine.gguf_plan import gguf_plan_config
from engine.gguf_sizes import gguf_sizes
from engine.memory import weight_bytes
from engine.models import load_model
from engine.runtime import Engine, generate_stream
from tests.engine.test_gguf import _Q4_0, _Q4_1, _Q4_K, _Q5_K, _Q8_0, gguf_from_hf

pytestmark = pytest.mark.anyio

# Every form the conversion writes: the five affine types, a float16 one (Q6_K), F16 and BF16 as stored, F32 norms.
_KINDS = {"token_embd.weight": _Q8_0, "blk.0.attn_q.weight": _Q4_0, "blk.0.attn_k.weight": _Q4_1,
          "blk.0.ffn_down.weight": _Q4_K, "blk.0.ffn_up.weight": _Q5_K,
          "blk.0.ffn_gate.weight": 14, "blk.1.attn_v.weight": 1, "blk.1.attn_output.weight": 30,
          "blk.1.ffn_up.weight": _Q4_0, "blk.1.ffn_gate.weight": _Q4_0, "blk.1.ffn_down.weight": _Q4_0,
          "blk.1.attn_q.weight": _Q4_0, "blk.1.attn_k.weight": _Q4_0, "blk.0.attn_v.weight": _Q4_0,
          "blk.0.attn_output.weight": _Q4_0}


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A llama with rows of 256 values (whole K-quant blocks) as a GGUF holding every tensor form."""
    from tests.fixtures.tiny_llm import build_tiny_llm

    root = tmp_path_factory.mktemp("gguf_sizes")
    wide = build_tiny_llm(root / "wide", hidden_size=256, intermediate_size=512)
    gguf_from_hf(wide, root / "mixed.gguf", _KINDS)
    return root / "mixed.gguf"


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "mlx-tandem" / "gguf"


def _budget_between(path: Path, low: int, high: int) -> int:
    """A budget whose room for weights (beside its fixed shares, constant below 1.28 GB) is halfway from low to
    high."""
    config = gguf_plan_config(*read_header(path))
    probe = 512 << 20
    return probe - room_for(config, probe) + (low + high) // 2


@pytest.mark.parametrize("dequantize", [False, True])
def test_the_header_gives_each_conversions_size(mixed_gguf: Path, cache_home: Path, dequantize: bool) -> None:
    sizes = gguf_sizes(read_header(mixed_gguf)[1])
    converted = convert_gguf(mixed_gguf, dequantize=dequantize)
    written = sum(v.nbytes for v in mx.load(str(converted / "model.safetensors")).values())
    assert written == (sizes.float32 if dequantize else sizes.stored)
    loaded = load_model(str(mixed_gguf), float32=dequantize)  # the same conversion, reused
    assert loaded.directory == converted
    assert weight_bytes(loaded.model) == written
    assert sizes.float32 > 3 * sizes.stored  # a mostly 4-bit file: the float32 the CPU got was ~7x


async def test_a_budget_between_the_sizes_serves_the_gguf_with_its_quantized_tensors_kept(
        mixed_gguf: Path, cache_home: Path, caplog: pytest.LogCaptureFixture) -> None:
    # It converted to float32 whatever the budget: a 7B Q4_K_M wrote ~28 GB to the cache, then failed the budget.
    sizes = gguf_sizes(read_header(mixed_gguf)[1])
    budget = _budget_between(mixed_gguf, sizes.stored, sizes.float32)
    with caplog.at_level(logging.INFO, logger="engine.gguf_plan"):
        tight = await Engine.open(str(mixed_gguf), max_active=2, memory_budget=budget, prompt_cache_bytes=0)
    try:
        assert tight.loaded.float32 is False
        layers = tight.loaded.model.model.layers
        assert isinstance(layers[0].self_attn.q_proj, nn.QuantizedLinear) and layers[0].mlp.up_proj.bits == 5
        assert weight_bytes(tight.loaded.model) == sizes.stored
        lines = [r.getMessage() for r in caplog.records if "without dequantizing" in r.getMessage()]
        assert len(lines) == 1 and "float32 weights of mixed.gguf" in lines[0], lines
        assert [p.name.endswith("-f32") for p in cache_home.iterdir()] == [False]  # no float32 entry written
        result = await generate_stream(tight, GenerationRequest([5, 6, 7], SamplingParams(temperature=0.0),
                                                                max_tokens=4))
        assert len(result.token_ids) == 4 and result.error is None
    finally:
        tight.close()
    roomy = load_model(str(mixed_gguf), memory_budget=budget + sizes.float32)  # room for float32: widened as before
    assert roomy.float32 is True and type(roomy.model.model.layers[0].self_attn.q_proj) is nn.Linear


def test_a_budget_below_even_the_kept_size_is_refused_before_converting(mixed_gguf: Path, cache_home: Path) -> None:
    sizes = gguf_sizes(read_header(mixed_gguf)[1])
    budget = _budget_between(mixed_gguf, 0, sizes.stored)
    with pytest.raises(ModelUnsupported, match=r"cannot hold mixed\.gguf's weights \(.* with its quantized tensors "
                                               r"kept, .* as float32\)") as refused:
        load_model(str(mixed_gguf), memory_budget=budget)
    assert "\n" not in str(refused.value)
    assert not cache_home.exists() or list(cache_home.iterdir()) == []


@pytest.mark.parametrize("dequantize", [False, True])
def test_a_disk_without_room_for_the_conversion_is_said_before_it_writes(
        mixed_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dequantize: bool) -> None:
    # A full disk failed the conversion mid-write with a bare [Errno 28], after minutes of work.
    sizes = gguf_sizes(read_header(mixed_gguf)[1])
    weights = sizes.float32 if dequantize else sizes.stored
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr("engine.gguf.shutil.disk_usage", lambda path: usage(10**12, 10**12 - weights, weights))
    with pytest.raises(OSError) as refused:
        convert_gguf(mixed_gguf, dequantize=dequantize, cache_root=tmp_path / "cache")
    message = str(refused.value)
    needed = f"{(weights + (32 << 20)) / 1e6:,.0f} MB"
    assert "\n" not in message and f"needs {needed} in {tmp_path / 'cache' / 'gguf'}" in message, message
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []  # neither an entry nor a staging folder
    monkeypatch.setattr("engine.gguf.shutil.disk_usage", lambda path: usage(10**12, 0, 10**12))
    assert (convert_gguf(mixed_gguf, dequantize=dequantize, cache_root=tmp_path / "cache") / "config.json").is_file()
