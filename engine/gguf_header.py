"""The GGUF header, read by us: each tensor's ggml type, and whether MLX's GGUF reader gives those tensors right
(its conversion of some types is wrong, and `mx.load` does not say which type a tensor had)."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

__all__ = ["GGUFError", "Q4_K", "TensorInfo", "check_readable", "tensor_infos", "tensor_types"]


class GGUFError(ValueError):
    """The GGUF file describes something this importer cannot load (architecture, tensor, tokenizer)."""


# ggml tensor types whose values MLX's GGUF reader gives as the file means them: its own F32/F16, the affine
# Q4_0/Q4_1/Q8_0, and BF16 and Q6_K (converted to float16; checked against ggml's reference dequantization). Q4_K came
# back wrong (each 64-value block's second half scaled by the first half's scale: half the values off, mlx 0.32.4)
# and is dequantized by us; the other K-quants and the IQ types are refused until checked too (Q5_K fails MLX's whole
# read, "gguf_tensor_to_f16 failed": reading it needs every tensor read by us).
Q4_K = 12  # read wrong by MLX: engine/gguf_kquants.py dequantizes it from the file instead
_READ_RIGHT = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 8: "Q8_0", Q4_K: "Q4_K", 14: "Q6_K", 30: "BF16"}
_TYPE_NAMES = {6: "Q5_0", 7: "Q5_1", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 13: "Q5_K", 15: "Q8_K"}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: its ggml type, shape (slowest dimension first, as an array's) and where its bytes
    start in the file."""

    kind: int
    shape: tuple[int, ...]
    start: int


def tensor_infos(path: str | os.PathLike[str]) -> dict[str, TensorInfo]:
    """Each tensor's type, shape and file position, from the GGUF header (version 2 or 3). Raises GGUFError for a
    file that is not a readable GGUF header."""
    scalars = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    with open(path, "rb") as f:
        def read(fmt: str) -> Any:
            size = struct.calcsize(fmt)
            raw = f.read(size)
            if len(raw) != size:
                raise GGUFError(f"{path}: the GGUF header ends early")
            return struct.unpack(fmt, raw)[0]

        def skip_value(kind: int) -> None:
            if kind == 8:
                f.seek(read("<Q"), os.SEEK_CUR)
            elif kind == 9:
                inner, count = read("<I"), read("<Q")
                if inner in scalars:
                    f.seek(struct.calcsize("<" + scalars[inner]) * count, os.SEEK_CUR)
                else:
                    for _ in range(count):
                        skip_value(inner)
            elif kind in scalars:
                f.seek(struct.calcsize("<" + scalars[kind]), os.SEEK_CUR)
            else:
                raise GGUFError(f"{path}: unknown GGUF value type {kind}")

        if f.read(4) != b"GGUF" or read("<I") not in (2, 3):
            raise GGUFError(f"{path} is not a GGUF file (version 2 or 3)")
        n_tensors, n_values = read("<Q"), read("<Q")
        alignment = 32
        for _ in range(n_values):
            key = f.read(read("<Q"))
            kind = read("<I")
            if key == b"general.alignment" and kind == 4:
                alignment = read("<I") or 32
            else:
                skip_value(kind)
        found: list[tuple[str, int, tuple[int, ...], int]] = []
        for _ in range(n_tensors):
            name = f.read(read("<Q")).decode("utf-8", "replace")
            dims = tuple(read("<Q") for _ in range(read("<I")))
            found.append((name, read("<I"), dims[::-1], read("<Q")))
        data = f.tell() + (-f.tell() % alignment)
        return {name: TensorInfo(kind, shape, data + offset) for name, kind, shape, offset in found}


def tensor_types(path: str | os.PathLike[str]) -> dict[str, int]:
    """Each tensor's ggml type. Raises GGUFError for a file that is not a readable GGUF header."""
    return {name: info.kind for name, info in tensor_infos(path).items()}


def check_readable(path: str | os.PathLike[str]) -> dict[str, TensorInfo]:
    """The tensors of `path` (`tensor_infos`). Raises GGUFError unless it is a GGUF whose tensors are loaded right
    (`_READ_RIGHT`)."""
    infos = tensor_infos(path)
    wrong = {name: info.kind for name, info in infos.items() if info.kind not in _READ_RIGHT}
    if wrong:
        kinds = sorted({_TYPE_NAMES.get(k, f"type {k}") for k in wrong.values()})
        raise GGUFError(
            f"{path} holds {', '.join(kinds)} tensors ({len(wrong)}, e.g. {next(iter(wrong))}), which MLX's GGUF "
            f"reader does not load correctly: use a GGUF of F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K or Q6_K tensors "
            f"(Q4_K_M files), or the model's safetensors")
    return infos
