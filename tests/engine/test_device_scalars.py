"""One float32 array per scalar value, made once."""

from __future__ import annotations

import mlx.core as mx

from engine.device_scalars import float32_scalar


def test_a_value_is_one_float32_array_made_once() -> None:
    a = float32_scalar(0.125)
    assert a is float32_scalar(0.125) and a is not float32_scalar(0.25)
    assert a.dtype == mx.float32 and a.ndim == 0 and a.item() == 0.125
