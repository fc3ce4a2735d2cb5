"""Which conversion the CPU gets for a GGUF: float32 (`dequantize`, MLX's CPU runs float32 through BLAS) where that
fits the memory budget, else the file's affine codes kept (a 7B Q4_K_M: ~4.5 GB, not ~28 GB of float32 written and
then refused); decided from the header before anything is written.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from engine.cpu_weights import budget_room
from engine.errors import ModelUnsupported
from engine.gguf import gguf_config
from engine.gguf_header import TensorInfo, read_header
from engine.gguf_sizes import FOLDED, gguf_sizes
from engine.gguf_tensors import check_types
from engine.memory import size_text

__all__ = ["gguf_plan_config", "gguf_float32"]

_log = logging.getLogger(__name__)


def gguf_plan_config(metadata: dict[str, Any], infos: dict[str, TensorInfo]) -> dict[str, Any]:
    """The config.json the conversion writes, as far as the memory plan reads it (sizes, heads, layers). Raises
    GGUFError as the conversion would (an architecture or hyperparameters it cannot map)."""
    return gguf_config(metadata, {name: info for name, info in infos.items() if name != FOLDED})


def gguf_float32(path: str | os.PathLike[str], memory_budget: int | None, **plan: int) -> bool:
    """Whether the CPU converts the GGUF at `path` to float32: True where that fits `memory_budget` (None: the
    machine's default; `plan`: max_iteration_tokens, max_active) beside the budget's fixed shares; False where only
    the kept codes fit, saying so in one line. Raises ModelUnsupported when even those do not fit, GGUFError for a
    file the conversion would refuse, OSError for one that does not read: all before anything is written."""
    metadata, infos = read_header(path)
    check_types(infos, path)
    sizes = gguf_sizes(infos)
    total, room = budget_room(gguf_plan_config(metadata, infos), memory_budget, **plan)
    if sizes.float32 <= room:
        return True
    name = Path(path).name
    if sizes.stored > room:
        raise ModelUnsupported(
            f"the memory budget of {size_text(total)} cannot hold {name}'s weights ({size_text(sizes.stored)} with its "
            f"quantized tensors kept, {size_text(sizes.float32)} as float32) beside its buffer cache, activations and one "
            f"row of KV ({size_text(max(0, total - room))}): raise --memory-budget")
    _log.info("float32 weights of %s (%s) would not fit the memory budget (%s): converting it without dequantizing "
              "(%s: Q4_0/Q4_1/Q8_0/Q4_K/Q5_K stay quantized, run by MLX's quantized matmul; other types float16)",
              name, size_text(sizes.float32), size_text(total), size_text(sizes.stored))
    return False
