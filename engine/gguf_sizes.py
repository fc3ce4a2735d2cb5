"""The bytes a GGUF's conversion (engine/gguf.py) holds, from the header's tensor table before any conversion (which
conversion the CPU gets is engine/gguf_plan.py's: gguf.py reads these sizes, so they cannot import it)."""

from __future__ import annotations

import math

from engine.cpu_weights import WeightSizes
from engine.gguf_header import TensorInfo
from engine.gguf_tensors import AFFINE_BITS

__all__ = ["FOLDED", "gguf_sizes"]

_F32 = 0
FOLDED = "rope_freqs.weight"  # folded into config.json's rope_scaling, never written


def gguf_sizes(infos: dict[str, TensorInfo]) -> WeightSizes:
    """The bytes of the weights a conversion writes (and mlx-lm loads): `float32` with `dequantize`, every tensor
    4 bytes a value; `stored` without: affine types as packed codes plus float16 scales and biases per 32 values,
    F32 as it is, every other type 2 bytes a value (F16, BF16, and float16 from llama.cpp's dequantization).
    Raises nothing."""
    kept = widened = 0
    for name, info in infos.items():
        if name == FOLDED:
            continue
        count = math.prod(info.shape)
        widened += 4 * count
        if (bits := AFFINE_BITS.get(info.kind)) is not None:
            kept += count * bits // 8 + count // 32 * 2 * 2
        else:
            kept += count * (4 if info.kind == _F32 else 2)
    return WeightSizes(stored=kept, float32=widened)
