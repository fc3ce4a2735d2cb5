"""Q4_K blocks dequantized from bytes (numpy), against ggml's loop (tests/engine/test_gguf.py's reference)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.gguf_header import GGUFError, TensorInfo
from engine.gguf_kquants import BLOCK_BYTES, dequantize_q4_k, read_q4_k
from tests.engine.test_gguf import _dequantize_q4_k


def _random_blocks(n: int, seed: int = 0) -> bytes:
    # Any bytes are a valid block once its two float16 scales are finite: every packed scale and minimum bit used.
    raw = np.random.default_rng(seed).integers(0, 256, (n, BLOCK_BYTES), dtype=np.uint8)
    raw[:, 0:2] = np.frombuffer(np.float16(0.0123).tobytes(), np.uint8)
    raw[:, 2:4] = np.frombuffer(np.float16(0.0045).tobytes(), np.uint8)
    return raw.tobytes()


def test_every_value_matches_ggmls_loop() -> None:
    raw = _random_blocks(6)
    np.testing.assert_allclose(dequantize_q4_k(raw), _dequantize_q4_k(raw), rtol=1e-6, atol=1e-6)


def test_a_tensor_is_read_at_its_place_and_a_short_file_is_named(tmp_path) -> None:
    raw = _random_blocks(2, seed=3)
    (tmp_path / "t.bin").write_bytes(b"x" * 96 + raw)
    got = read_q4_k(tmp_path / "t.bin", TensorInfo(12, (2, 256), 96))
    np.testing.assert_allclose(got, _dequantize_q4_k(raw).reshape(2, 256), rtol=1e-6, atol=1e-6)
    with pytest.raises(GGUFError, match="past the end of the file"):
        read_q4_k(tmp_path / "t.bin", TensorInfo(12, (3, 256), 96))
    with pytest.raises(GGUFError, match="whole 144-byte blocks"):
        dequantize_q4_k(raw[:100])
