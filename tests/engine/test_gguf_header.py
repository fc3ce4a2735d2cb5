"""The GGUF header as we read it: each tensor's type, and the types MLX's reader gets wrong refused by name."""

from __future__ import annotations

import struct

import pytest

from engine.gguf_header import GGUFError, check_readable, tensor_types
from engine.models import load_model
from tests.engine.test_gguf import _ALIGN, _string, _value, cache_home  # noqa: F401  (fixture)


def _one_tensor_gguf(path, kind: int, data: bytes) -> None:
    meta = {"general.architecture": "llama", "general.name": "x", "llama.context_length": 64, "x.f": 0.5,
            "x.tokens": ["a", "b"], "x.ids": [1, 2, 3], "x.flag": True}
    info = _string("blk.0.attn_q.weight") + struct.pack("<I2QIQ", 2, 256, 1, kind, 0)
    header = b"GGUF" + struct.pack("<IQQ", 3, 1, len(meta))
    header += b"".join(_string(k) + _value(v) for k, v in meta.items()) + info
    path.write_bytes(header + b"\0" * (-len(header) % _ALIGN) + data)


def test_a_k_quant_mlx_reads_wrong_is_refused_by_name(tmp_path, cache_home) -> None:
    # MLX's reader gave Q4_K blocks the wrong scales and the server answered 200 with the wrong weights; Q4_K is
    # dequantized by us now (test_gguf.py), the K-quants not yet checked are refused at the header, by name.
    _one_tensor_gguf(tmp_path / "q5k.gguf", 13, bytes(176))  # one Q5_K block of 256 values
    assert tensor_types(tmp_path / "q5k.gguf") == {"blk.0.attn_q.weight": 13}
    with pytest.raises(GGUFError, match=r"Q5_K tensors \(1, e\.g\. blk\.0\.attn_q\.weight\).*Q4_K or Q6_K"):
        load_model(str(tmp_path / "q5k.gguf"))


def test_the_types_mlx_reads_right_pass_and_a_header_that_stops_is_named(tmp_path) -> None:
    # Metadata of every kind is skipped to reach the tensor infos (strings, arrays of strings and numbers, floats).
    _one_tensor_gguf(tmp_path / "q8.gguf", 8, bytes(272))  # Q8_0: 8 blocks of 34 bytes
    check_readable(tmp_path / "q8.gguf")
    assert tensor_types(tmp_path / "q8.gguf") == {"blk.0.attn_q.weight": 8}
    whole = (tmp_path / "q8.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(whole[:40])
    with pytest.raises(GGUFError, match="ends early"):
        tensor_types(tmp_path / "cut.gguf")
