"""audio/cpu_math.py: numpy's softmax and GELU equal MLX's to rounding, overwrite their input, compute every
row alone, and refuse arrays they cannot overwrite."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from audio.cpu_math import gelu_, softmax_


def fresh(shape: tuple[int, ...], seed: int, scale: float = 3.0) -> mx.array:
    x = mx.array(np.random.default_rng(seed).normal(0, scale, shape).astype(np.float32)) * 1.0  # an op's own output
    mx.eval(x)
    return x


def test_softmax_equals_mlx_precise_softmax_in_place() -> None:
    x = fresh((2, 3, 40, 1500), seed=0, scale=8.0)
    expected = mx.softmax(x, axis=-1, precise=True)
    mx.eval(expected)
    got = softmax_(x)
    assert got is x  # written over x: no copy back into MLX
    assert mx.allclose(got, expected, rtol=1e-5, atol=1e-7).item()
    assert mx.allclose(got.sum(axis=-1), mx.ones((2, 3, 40)), atol=1e-5).item()


def test_softmax_rows_do_not_depend_on_the_rows_beside_them() -> None:
    x = fresh((1, 2, 300, 1500), seed=1)
    part = mx.contiguous(x[:, :, 64:128]) * 1.0
    mx.eval(part)
    whole = softmax_(x)
    assert mx.array_equal(softmax_(part), whole[:, :, 64:128]).item()


def test_gelu_equals_mlx_gelu_in_place() -> None:
    x = fresh((3, 200, 1536), seed=2, scale=4.0)
    expected = nn.gelu(x)
    mx.eval(expected)
    got = gelu_(x)
    assert got is x
    assert mx.allclose(got, expected, rtol=1e-5, atol=1e-6).item()


def test_arrays_it_cannot_overwrite_are_refused() -> None:
    with pytest.raises(TypeError):
        softmax_(fresh((4, 8), seed=3).astype(mx.float16))
    with pytest.raises(ValueError):
        gelu_(fresh((8, 4), seed=4).T)  # a transposed view: not contiguous
