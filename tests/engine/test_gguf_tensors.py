"""engine.gguf_tensors: ggml blocks become MLX affine codes exactly as ggml's loops decode them; files cut short or
of types nothing reads are named."""

from __future__ import annotations

import numpy as np
import pytest

import engine  # noqa: F401  (fast BLAS before mlx)
import mlx.core as mx

from engine.gguf_header import GGUFError, read_header
from engine.gguf_tensors import affine_codes, pack_codes, read_tensors
from tests.engine.test_gguf import (_Q4_0, _Q4_1, _Q4_K, _Q5_K, _Q8_0, _dequantize_q4_k, _dequantize_q5_k,
                                    dequantize, quantize, random_blocks, write_gguf)


@pytest.mark.parametrize("bits", [4, 5, 8])
def test_codes_pack_as_mlx_unpacks_them(bits: int) -> None:
    rows = 2100  # past one 1,024-row slice of the 5-bit path
    codes = np.random.default_rng(bits).integers(0, 2**bits, (rows, 96), dtype=np.uint8)
    packed = mx.array(pack_codes(codes, bits))
    assert packed.shape == (rows, 96 * bits // 32) and packed.dtype == mx.uint32
    values = mx.dequantize(packed, mx.ones((rows, 3)), mx.zeros((rows, 3)), group_size=32, bits=bits)
    np.testing.assert_array_equal(np.array(values).astype(np.uint8), codes)


@pytest.mark.parametrize("kind,size,reference", [(_Q4_K, 144, _dequantize_q4_k), (_Q5_K, 176, _dequantize_q5_k)])
def test_k_quant_codes_match_ggmls_loops(kind: int, size: int, reference) -> None:
    raw = random_blocks(kind, 256 * 5, seed=kind)  # every scale, minimum and code bit used
    codes, scales, biases = affine_codes(kind, np.frombuffer(raw, np.uint8).reshape(-1, size))
    values = (scales[:, None] * codes.astype(np.float32) + biases[:, None]).reshape(-1)
    np.testing.assert_allclose(values, reference(raw), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind,size", [(_Q8_0, 34), (_Q4_0, 18), (_Q4_1, 20)])
def test_32_value_types_match_their_reference(kind: int, size: int) -> None:
    x = np.random.default_rng(kind).standard_normal((4, 64)).astype(np.float32)
    raw = quantize(x, kind)
    codes, scales, biases = affine_codes(kind, np.frombuffer(raw, np.uint8).reshape(-1, size))
    values = (scales[:, None] * codes.astype(np.float32) + biases[:, None]).reshape(4, 64)
    np.testing.assert_array_equal(values, dequantize(raw, kind, (4, 64)))


def test_metadata_comes_back_as_written_and_a_cut_file_is_named(tmp_path) -> None:
    meta = {"general.architecture": "llama", "llama.context_length": 64, "x.eps": 1e-5, "x.tokens": ["a", "b"],
            "x.ids": [1, 2, 3], "x.flag": True}
    write_gguf(tmp_path / "m.gguf", meta, {"blk.0.attn_q.weight": (np.ones((2, 256), np.float32), _Q4_K)})
    metadata, infos = read_header(tmp_path / "m.gguf")
    assert metadata == meta and infos["blk.0.attn_q.weight"].shape == (2, 256)
    whole = (tmp_path / "m.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(whole[:-100])  # the last tensor's bytes cut short
    with pytest.raises(GGUFError, match="cut.gguf: the file ends early, inside tensor blk.0.attn_q.weight"):
        read_tensors(tmp_path / "cut.gguf", read_header(tmp_path / "cut.gguf")[1])
    (tmp_path / "head.gguf").write_bytes(whole[:40])
    with pytest.raises(GGUFError, match="the GGUF header ends early"):
        read_header(tmp_path / "head.gguf")
