"""Scalars custom kernels read from device memory (a norm's eps, an attention scale): one float32 array per value,
made once, so a step does not build a new array for a constant every launch."""

from __future__ import annotations

import mlx.core as mx

__all__ = ["float32_scalar"]

_made: dict[float, mx.array] = {}


def float32_scalar(value: float) -> mx.array:
    """The float32 array holding `value`, the same one each call. Raises nothing."""
    arr = _made.get(value)
    if arr is None:
        arr = _made[value] = mx.array(value, dtype=mx.float32)
    return arr
