"""The Whisper encoder's elementwise-heavy math in numpy, for MLX's CPU backend only.

On the CPU backend MLX's elementwise kernels are single-threaded and its `exp` costs ~13–16 ns an element
against numpy's ~3 ns (SIMD), so the encoder's self-attention softmax (6×1500×1500 per layer for a 30 s
window) and its GELUs dominate a pass. Every row of a softmax and every element of a GELU is computed alone,
so results do not depend on how positions are chunked or windows stacked (bitwise); they differ from MLX's
own kernels by rounding only. Matmuls stay in MLX (its BLAS is the fast part). Measured on this 2-core
machine (bench/encoder_pass.py): two numpy threads gained nothing at the encoder's chunk sizes, and copying
a result back into MLX cost as much as the softmax itself, hence one thread and results written in place.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["numpy_math_pays", "softmax_", "gelu_"]

_SQRT1_2 = np.float32(0.7071067811865476)


def numpy_math_pays() -> bool:
    """True when MLX runs on its CPU backend, where numpy's elementwise math is several times faster.
    Engine thread (imports MLX). Raises nothing."""
    import mlx.core as mx

    return bool(mx.default_device().type == mx.DeviceType.cpu)


def _owned(x: Any) -> np.ndarray:
    """`x` evaluated, as a writable numpy view of its memory (CPU backend: MLX memory is host memory)."""
    import mlx.core as mx

    if x.dtype != mx.float32:
        raise TypeError(f"numpy math runs on float32 arrays, got {x.dtype}")
    mx.eval(x)
    a = np.asarray(x)
    if not (a.flags.c_contiguous and a.flags.writeable):
        raise ValueError("numpy math needs a contiguous array it may overwrite")
    return a


def softmax_(x: Any) -> Any:
    """Softmax over the last axis, max-subtracted in float32 like MLX's `precise=True`, written over `x`'s
    memory; returns `x`. `x` must be a float32 array the caller alone holds, fresh from an op that allocates
    its output (a matmul), not a view: its old values are gone. Evaluates `x`. Raises TypeError (not
    float32), ValueError (not contiguous), what MLX raises while evaluating it."""
    a = _owned(x)
    np.subtract(a, a.max(axis=-1, keepdims=True), out=a)
    np.exp(a, out=a)
    a /= a.sum(axis=-1, keepdims=True)
    return x


def gelu_(x: Any) -> Any:
    """Exact (erf) GELU as `mlx.nn.gelu` defines it, x·(1 + erf(x/√2))/2, written over `x`'s memory; returns
    `x`. Same contract and errors as `softmax_`."""
    from scipy.special import erf  # a dependency of mlx-whisper; numpy has no erf

    a = _owned(x)
    y = np.multiply(a, _SQRT1_2)
    erf(y, out=y)
    y += 1
    a *= y
    a *= 0.5
    return x
