"""ggml's Q4_K blocks dequantized from the file's bytes (numpy), for the tensors MLX's GGUF reader gets wrong.

A block holds 256 values: a float16 scale `d` and minimum scale `dmin`, twelve bytes packing eight 6-bit scales and
eight 6-bit minimums (one pair per 32 values), and 128 bytes of 4-bit quants — each 64 values take the low nibbles
of 32 bytes, then their high nibbles (ggml's `dequantize_row_q4_K`).
"""

from __future__ import annotations

import os

import numpy as np

from engine.gguf_header import GGUFError, TensorInfo

__all__ = ["BLOCK_BYTES", "dequantize_q4_k", "read_q4_k"]

BLOCK_BYTES = 144  # 2 + 2 + 12 + 128
_BLOCK_VALUES = 256


def dequantize_q4_k(raw: bytes | np.ndarray) -> np.ndarray:
    """Float32 values of consecutive Q4_K blocks. Raises GGUFError when `raw` is not whole blocks."""
    blocks = np.frombuffer(raw, dtype=np.uint8) if isinstance(raw, bytes) else raw
    if blocks.size % BLOCK_BYTES:
        raise GGUFError(f"Q4_K data of {blocks.size} bytes is not whole {BLOCK_BYTES}-byte blocks")
    blocks = blocks.reshape(-1, BLOCK_BYTES)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # (B, 1)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    packed = blocks[:, 4:16].astype(np.int32)
    scales = np.concatenate([packed[:, 0:4] & 63, (packed[:, 8:12] & 0xF) | ((packed[:, 0:4] >> 6) << 4)], axis=1)
    mins = np.concatenate([packed[:, 4:8] & 63, (packed[:, 8:12] >> 4) | ((packed[:, 4:8] >> 6) << 4)], axis=1)
    quants = blocks[:, 16:].reshape(-1, 4, 32)
    nibbles = np.stack([quants & 0xF, quants >> 4], axis=2).astype(np.float32)  # (B, 4 chunks, low/high, 32)
    scale = (d * scales).reshape(-1, 4, 2, 1)
    offset = (dmin * mins).reshape(-1, 4, 2, 1)
    return (scale * nibbles - offset).reshape(-1)


def read_q4_k(path: str | os.PathLike[str], info: TensorInfo) -> np.ndarray:
    """One Q4_K tensor of the file at `path`, dequantized, in its shape (float32). Raises GGUFError when the file
    ends before the tensor does."""
    count = int(np.prod(info.shape))
    if count % _BLOCK_VALUES:
        raise GGUFError(f"a Q4_K tensor of {count} values is not whole {_BLOCK_VALUES}-value blocks")
    size = count // _BLOCK_VALUES * BLOCK_BYTES
    raw = np.fromfile(path, dtype=np.uint8, count=size, offset=info.start)
    if raw.size != size:
        raise GGUFError(f"{path}: a Q4_K tensor extends past the end of the file")
    return dequantize_q4_k(raw).reshape(info.shape)
