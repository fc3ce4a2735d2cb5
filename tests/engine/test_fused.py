"""Fused projections: one matmul for q/k/v and for gate/up gives each layer's own output, quantized or
not, with or without bias, and leaves the model's own forward unchanged (its weights become views)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest

from engine.fused import FusedLinear, fused_mlp, rope_rows


def layers(bias: bool, quantize: bool) -> list[nn.Module]:
    mx.random.seed(3)
    out = [nn.Linear(64, n, bias=bias) for n in (64, 32, 32)]
    if quantize:
        out = [nn.QuantizedLinear.from_linear(layer, group_size=32, bits=4) for layer in out]
    mx.eval([layer.parameters() for layer in out])
    return out


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("quantize", [False, True])
def test_one_matmul_gives_each_layers_output(bias: bool, quantize: bool) -> None:
    group = layers(bias, quantize)
    x = mx.random.normal((1, 5, 64))
    expected = [layer(x) for layer in group]
    fused = FusedLinear(group)
    assert fused.fused
    for got, want in zip(fused(x), expected):
        assert got.shape == want.shape and mx.allclose(got, want, atol=1e-4).item()
    for layer, want in zip(group, expected):  # the layers read views of the fused buffer, same values
        assert mx.allclose(layer(x), want, atol=1e-4).item()


def test_layers_of_different_kinds_are_called_one_by_one() -> None:
    plain, quantized = layers(False, False), layers(False, True)
    mixed = [plain[0], quantized[1]]
    x = mx.random.normal((1, 3, 64))
    fused = FusedLinear(mixed)
    assert not fused.fused
    for got, layer in zip(fused(x), mixed):
        assert mx.allclose(got, layer(x)).item()


def test_the_fused_mlp_matches_mlx_lms_and_the_model_is_unchanged(tiny_loaded) -> None:
    model = tiny_loaded.model
    tokens = mx.array([[5, 9, 11, 40]])
    before = model(tokens)
    mlp = model.model.layers[0].mlp
    x = mx.random.normal((1, 4, model.args.hidden_size))
    want = mlp(x)
    assert mx.allclose(fused_mlp(mlp)(x), want, atol=1e-5).item()
    assert mx.allclose(model(tokens), before, atol=1e-5).item()


@pytest.mark.parametrize("rows, n_heads, head_dim", [(200, 6, 16), (64, 16, 16), (200, 6, 64), (5, 6, 16)])
def test_rope_rows_rotates_each_row_at_its_offset(rows: int, n_heads: int, head_dim: int) -> None:
    # At head_dim 16 and 64+ rows MLX's CUDA RoPE (one offset a row) did not launch: the rows go in groups.
    rope = nn.RoPE(head_dim, base=10000.0)
    x = mx.random.normal((rows, n_heads, 1, head_dim), key=mx.random.key(3))
    offsets = (mx.arange(rows) * 7) % 301
    got = rope_rows(rope, x, offsets)
    one_by_one = mx.concatenate([rope(x[i:i + 1], offset=int(offsets[i].item())) for i in range(rows)])
    assert got.shape == x.shape
    assert mx.allclose(got, one_by_one, atol=1e-5).item()
    same = mx.concatenate([rope(x[i:i + 1], offset=5) for i in range(rows)])
    assert mx.allclose(rope_rows(rope, x, 5), same, atol=1e-5).item()  # one offset for all (in groups too)
