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

from engine.accelerator import on_gpu

__all__ = ["numpy_math_pays", "softmax_", "gelu_"]

_SQRT1_2 = np.float32(0.7071067811865476)
_ERF_P = np.float32(0.3275911)
_ERF_A = [np.float32(c) for c in (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)]


def numpy_math_pays() -> bool:
    """True when MLX runs on its CPU backend, where numpy's elementwise math is several times faster.
    Engine thread (imports MLX). Raises nothing."""
    return not on_gpu()


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


def _erf_complement(u: np.ndarray) -> np.ndarray:
    """1 − erf(|u|) by Abramowitz & Stegun 7.1.26 (|error| ≤ 1.5e-7; measured in float32 against scipy's
    float64 erf: 6e-7, MLX's own CPU erf: 5.4e-7), overwriting `u` with exp(−u²). scipy.special.erf is
    scalar code (~20 ns an element, slower than MLX here); this is ~4 ns with numpy's SIMD loops."""
    t = np.abs(u)
    t *= _ERF_P
    t += 1
    np.reciprocal(t, out=t)
    r = np.multiply(t, _ERF_A[0])
    for a in _ERF_A[1:]:
        r += a
        r *= t
    np.square(u, out=u)
    np.negative(u, out=u)
    np.exp(u, out=u)
    r *= u
    return r


def gelu_(x: Any) -> Any:
    """Exact (erf) GELU as `mlx.nn.gelu` defines it, x·(1 + erf(x/√2))/2, written over `x`'s memory; returns
    `x`. Same contract and errors as `softmax_`."""
    a = _owned(x)
    r = _erf_complement(np.multiply(a, _SQRT1_2))
    np.subtract(1, r, out=r)
    np.copysign(r, a, out=r)  # erf(x/√2)
    r += 1
    a *= r
    a *= 0.5
    return x
