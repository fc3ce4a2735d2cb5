"""The GGUF header, read by us: the metadata's values and each tensor's ggml type, shape and place in the file
(llama.cpp's own `gguf.GGUFReader` takes ~13 s over a 49,152-token vocabulary: it maps every string as an array)."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

__all__ = ["GGUFError", "TensorInfo", "read_header"]


class GGUFError(ValueError):
    """The GGUF file describes something this importer cannot load (architecture, tensor, tokenizer)."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: its ggml type, shape (slowest dimension first, as an array's) and where its bytes
    start in the file."""

    kind: int
    shape: tuple[int, ...]
    start: int


_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_ARRAYS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}


def read_header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
    """The metadata (plain Python values; float32 to 7 significant digits, what was written) and each tensor's
    type, shape and file position, from a GGUF header (version 2 or 3). Raises GGUFError for a file that is not
    one or whose header stops early."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise GGUFError(f"{path} is not a GGUF file")
        reader = _Reader(f, path)
        if reader.scalar(4) not in (2, 3):
            raise GGUFError(f"{path} is not a GGUF file of version 2 or 3")
        n_tensors, n_values = reader.scalar(10), reader.scalar(10)
        metadata = {reader.string(): reader.value(reader.scalar(4)) for _ in range(n_values)}
        found: list[tuple[str, int, tuple[int, ...], int]] = []
        for _ in range(n_tensors):
            name = reader.string()
            dims = tuple(reader.scalar(10) for _ in range(reader.scalar(4)))
            found.append((name, reader.scalar(4), dims[::-1], reader.scalar(10)))  # ggml lists the fastest first
        alignment = int(metadata.get("general.alignment") or 32)
        data = f.tell() + (-f.tell() % alignment)
        return metadata, {name: TensorInfo(kind, shape, data + offset) for name, kind, shape, offset in found}


class _Reader:
    def __init__(self, f: BinaryIO, path: str | os.PathLike[str]) -> None:
        self.f, self.path = f, path

    def raw(self, size: int) -> bytes:
        got = self.f.read(size)
        if len(got) != size:
            raise GGUFError(f"{self.path}: the GGUF header ends early")
        return got

    def scalar(self, kind: int) -> Any:
        fmt = "<" + _SCALARS[kind]
        value = struct.unpack(fmt, self.raw(struct.calcsize(fmt)))[0]
        return float(f"{value:.7g}") if kind == 6 else value

    def string(self) -> str:
        return self.raw(self.scalar(10)).decode("utf-8", "replace")

    def value(self, kind: int) -> Any:
        if kind == 8:
            return self.string()
        if kind in _SCALARS:
            return self.scalar(kind)
        if kind != 9:
            raise GGUFError(f"{self.path}: unknown GGUF value type {kind}")
        inner, count = self.scalar(4), self.scalar(10)
        if inner in _ARRAYS:
            values = np.frombuffer(self.raw(np.dtype(_ARRAYS[inner]).itemsize * count), _ARRAYS[inner]).tolist()
            return [float(f"{v:.7g}") for v in values] if inner == 6 else values
        return [self.value(inner) for _ in range(count)]
