"""Every tensor of a GGUF file from the file's bytes (engine/gguf_header.py says where each is).

Types whose values are exactly `scale × code + bias` per 32 values become MLX affine triples (weight, scales, biases;
group 32) with the file's codes: Q4_0, Q4_1, Q8_0, and the K-quants Q4_K and Q5_K (a 6-bit scale and minimum per 32
values, times the block's two float16 scales; their product is the only rounding, float32 here). Every other type
(Q5_0, Q5_1, Q2_K, Q3_K, Q6_K, the IQ types, ...: groups of 16 or lookup tables, no MLX layout) becomes float16
through llama.cpp's own reference dequantization (the `gguf` package). MLX's own GGUF reader is not used: it read
Q4_K wrong (each 64-value block's second half with the first half's scale, mlx 0.32.4) and failed a whole file over
one Q5_K, Q3_K or IQ tensor.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

from engine.gguf_header import GGUFError, TensorInfo
from engine.load_stop import Stoppable, check_stop

__all__ = ["AFFINE_BITS", "affine_codes", "check_types", "pack_codes", "read_tensors"]

# ggml type → (bits, block bytes) of the types kept as affine triples.
_AFFINE = {2: (4, 18), 3: (4, 20), 8: (8, 34), 12: (4, 144), 13: (5, 176)}  # Q4_0, Q4_1, Q8_0, Q4_K, Q5_K
# The bits of each type kept as affine codes (engine/gguf_sizes.py sizes a conversion from them).
AFFINE_BITS = {kind: bits for kind, (bits, _) in _AFFINE.items()}
_F32, _F16, _BF16 = 0, 1, 30


@functools.cache
def _dequantizable(kind: int) -> bool:
    """Whether the `gguf` package dequantizes ggml type `kind` (one block of zeros tried). Raises nothing."""
    import gguf

    try:
        qtype = gguf.GGMLQuantizationType(kind)
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        gguf.quants.dequantize(np.zeros((1, size), np.uint8), qtype)
        return True
    except (ValueError, KeyError, NotImplementedError):
        return False


def _type_name(kind: int) -> str:
    import gguf

    try:
        return gguf.GGMLQuantizationType(kind).name
    except ValueError:
        return f"type {kind}"


def check_types(infos: dict[str, TensorInfo], path: str | os.PathLike[str]) -> None:
    """Raises GGUFError naming the tensor types in `infos` that neither MLX's layout nor `gguf` reads."""
    bad = {name: info.kind for name, info in infos.items()
           if info.kind not in (_F32, _F16, _BF16, *_AFFINE) and not _dequantizable(info.kind)}
    if bad:
        kinds = ", ".join(sorted({_type_name(k) for k in bad.values()}))
        raise GGUFError(f"{path} holds {kinds} tensors ({len(bad)}, e.g. {next(iter(bad))}), which this importer "
                        f"cannot read: use another quantization of the model, or its safetensors")


def _nbytes(info: TensorInfo) -> int:
    import gguf

    count = int(np.prod(info.shape))
    if info.kind in (_F32, _F16, _BF16):
        return count * (4 if info.kind == _F32 else 2)
    values, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(info.kind)]
    if info.shape[-1] % values:
        raise GGUFError(f"a {_type_name(info.kind)} tensor's rows of {info.shape[-1]} values are not whole "
                        f"{values}-value blocks")
    return count // values * size


def _k_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: (scale, minimum) of each 32-value group, float32, (blocks, 8): d × 6-bit scale, dmin × 6-bit min."""
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    packed = blocks[:, 4:16].astype(np.int32)
    scales = np.concatenate([packed[:, 0:4] & 63, (packed[:, 8:12] & 0xF) | ((packed[:, 0:4] >> 6) << 4)], axis=1)
    mins = np.concatenate([packed[:, 4:8] & 63, (packed[:, 8:12] >> 4) | ((packed[:, 4:8] >> 6) << 4)], axis=1)
    return d * scales, dmin * mins


def affine_codes(kind: int, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes uint8 (groups, 32), scales, biases float32 (groups,)) of blocks (uint8, (n, block bytes)) of an affine
    type, in value order: value = scale × code + bias (ggml's dequantize_row_* for that type)."""
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)[:, 0]
    if kind == 8:  # Q8_0: d, 32 int8
        codes = (blocks[:, 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return codes, d, -128 * d
    if kind in (2, 3):  # Q4_0 (d, 16 bytes) / Q4_1 (d, m, 16 bytes): low nibbles are values 0-15, high 16-31
        nibbles = blocks[:, -16:]
        codes = np.concatenate([nibbles & 0xF, nibbles >> 4], axis=1)
        bias = -8 * d if kind == 2 else blocks[:, 2:4].copy().view(np.float16).astype(np.float32)[:, 0]
        return codes, d, bias
    scale, low = _k_scales(blocks)  # Q4_K / Q5_K: each 64 values take the low nibbles of 32 bytes, then the high
    ql = blocks[:, -128:].reshape(-1, 4, 1, 32)
    codes = np.concatenate([ql & 0xF, ql >> 4], axis=2)  # (n, 4 chunks, low/high, 32)
    if kind == 13:  # Q5_K: the fifth bit of group g is bit g of each of the 32 `qh` bytes
        qh = blocks[:, 16:48].reshape(-1, 1, 1, 32)
        groups = np.arange(8, dtype=np.uint8).reshape(1, 4, 2, 1)
        codes = codes + (((qh >> groups) & 1) << 4)
    return codes.reshape(-1, 32).astype(np.uint8), scale.reshape(-1), -low.reshape(-1)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes (rows, cols) packed as MLX's affine weights: a little-endian bit stream of `bits`-bit values in uint32
    words, (rows, cols × bits / 32)."""
    rows, cols = codes.shape
    if bits == 8:
        packed = np.ascontiguousarray(codes, dtype=np.uint8)
    elif bits == 4:
        pairs = codes.reshape(rows, cols // 2, 2)
        packed = (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)
    else:  # a bit per byte on the way: rows a slice at a time (an 8B model's 5-bit embedding is 525 M codes)
        packed = np.empty((rows, cols * bits // 8), np.uint8)
        shifts = np.arange(bits, dtype=np.uint8)
        for r in range(0, rows, 1024):
            stream = (codes[r:r + 1024, :, None] >> shifts) & 1
            packed[r:r + 1024] = np.packbits(stream.reshape(-1, cols * bits), axis=1, bitorder="little")
    return np.ascontiguousarray(packed).view("<u4").reshape(rows, cols * bits // 32)


def _tensor(info: TensorInfo, data: np.ndarray) -> dict[str, Any]:
    """One tensor's bytes as MLX arrays: {"weight": dense} or {"weight", "scales", "biases"} (float32 scales and
    biases)."""
    import gguf
    import mlx.core as mx

    kind, shape = info.kind, info.shape
    if kind == _F32:
        return {"weight": mx.array(data.view("<f4").reshape(shape))}
    if kind == _F16:
        return {"weight": mx.array(data.view("<f2").reshape(shape))}
    if kind == _BF16:
        return {"weight": mx.array(data.view("<u2").reshape(shape)).view(mx.bfloat16)}
    rows = int(np.prod(shape)) // shape[-1]
    if kind in _AFFINE:
        bits, size = _AFFINE[kind]
        codes, scales, biases = affine_codes(kind, data.reshape(-1, size))
        return {"weight": mx.array(pack_codes(codes.reshape(rows, shape[-1]), bits).reshape(*shape[:-1], -1)),
                "scales": mx.array(scales.reshape(*shape[:-1], -1)), "biases": mx.array(biases.reshape(*shape[:-1], -1))}
    values = gguf.quants.dequantize(data.reshape(rows, -1), gguf.GGMLQuantizationType(kind))
    return {"weight": mx.array(values.reshape(shape).astype(np.float16))}


def read_tensors(path: str | os.PathLike[str], infos: dict[str, TensorInfo], label: str | None = None, *,
                 stop: Stoppable | None = None) -> dict[str, Any]:
    """Every tensor of the file by its GGUF name: `name` (dense) or, for an affine type, `name`, `….scales` and
    `….biases` (the `.weight` suffix swapped); a progress bar under `label`. Raises GGUFError for an unreadable
    type or a file that ends before a tensor does, LoadStopped when `stop` (None: this process's,
    engine/load_stop.py) is set between two tensors."""
    import mlx.core as mx

    from engine.progress import progress

    check_types(infos, path)
    file = np.memmap(path, dtype=np.uint8, mode="r")
    out: dict[str, Any] = {}
    for name, info in progress(list(infos.items()), label) if label else infos.items():
        check_stop(stop, label or f"reading {path}")
        size = _nbytes(info)
        if info.start + size > file.size:
            raise GGUFError(f"{path}: the file ends early, inside tensor {name}")
        parts = _tensor(info, np.asarray(file[info.start:info.start + size]))
        mx.eval(*parts.values())  # one tensor at a time, so a bar moves as the work is done
        base = name[: -len(".weight")] if name.endswith(".weight") else name
        for suffix, array in parts.items():
            out[name if suffix == "weight" else f"{base}.{suffix}"] = array
    return out
