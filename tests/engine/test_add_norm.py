"""The residual add and RMSNorm kernel: off a CUDA device the two MLX ops, and the compiled decode step routes
every add and norm through it when it serves (checked here with the ops standing in for the kernel); on CUDA the
kernel itself against MLX's add and `rms_norm`."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.utils import load

from engine import add_norm
from engine.runner import PackedRunner
from tests.engine.test_slots import check_schedule
from tests.fixtures.tiny_llm import build_tiny_llm

CUDA = mx.default_device().type == mx.DeviceType.gpu and mx.cuda.is_available()


class ScaledNorm(nn.RMSNorm):
    """A norm of another kind (Gemma's multiplies by 1 + weight): the kernel must not stand in for it."""

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.rms_norm(x, 1.0 + self.weight, self.eps)


def test_without_the_kernel_it_is_the_two_ops() -> None:
    norm = nn.RMSNorm(16, eps=1e-5)
    norm.weight = mx.arange(16, dtype=mx.float32) / 8
    h, d = mx.random.normal((1, 3, 16), key=mx.random.key(0)), mx.random.normal((1, 3, 16), key=mx.random.key(1))
    s, y = add_norm.add_norm(h, d, norm, kernel=False)
    assert mx.array_equal(s, h + d).item()
    assert mx.allclose(y, norm(h + d)).item()


def test_only_plain_rms_norms_are_fused() -> None:
    assert add_norm.fusable(nn.RMSNorm(8))
    assert not add_norm.fusable(ScaledNorm(8))
    assert not add_norm.fusable(nn.LayerNorm(8))


def test_the_kernel_is_off_without_cuda() -> None:
    if CUDA:
        pytest.skip("a CUDA device")
    assert not add_norm.available(mx.bfloat16, 2048)


def through_ops(monkeypatch) -> list[tuple[int, ...]]:
    """Serve the kernel's calls with MLX's ops (as if it passed its self-test here); returns each call's shape."""
    calls: list[tuple[int, ...]] = []

    def kernel_call(h, d, weight, eps):
        calls.append(tuple(h.shape))
        return add_norm.reference(h, d, weight, eps)

    monkeypatch.setenv("TANDEM_DECODE_COMPILE", "on")
    monkeypatch.setattr(add_norm, "available", lambda dtype, hidden: True)
    monkeypatch.setattr(add_norm, "_kernel_call", kernel_call)
    return calls


def test_every_forward_takes_every_add_and_norm_through_the_kernel(tiny_loaded, monkeypatch) -> None:
    # Each layer's two adds: the one after attention with its MLP's norm, the one after the MLP with the next
    # layer's input norm (the last with the model's final norm), in compiled decode steps and in built forwards
    # (prompts, mixed steps); logits still equal mlx-lm's per row.
    calls = through_ops(monkeypatch)
    runners: list[PackedRunner] = []
    init = PackedRunner.__init__

    def record(self, model):
        init(self, model)
        runners.append(self)

    monkeypatch.setattr(PackedRunner, "__init__", record)
    check_schedule(tiny_loaded.model)
    compiled = runners[0].compiled
    assert compiled is not None and compiled._add_norm
    layers = len(runners[0].layers)
    assert calls and len(calls) % (2 * layers) == 0
    assert compiled.traces >= 1  # compiled steps ran
    assert max(shape[1] for shape in calls) == 20  # and the longest prompt's forward


def test_a_model_with_another_norm_keeps_the_two_ops(tmp_path, monkeypatch) -> None:
    calls = through_ops(monkeypatch)
    model, _ = load(str(build_tiny_llm(tmp_path)))  # its own: one of its norms is swapped for another kind
    layer = model.model.layers[-1]
    weight = layer.post_attention_layernorm.weight
    other = ScaledNorm(weight.shape[0])
    other.weight = weight - 1.0
    layer.post_attention_layernorm = other
    runners: list[PackedRunner] = []
    init = PackedRunner.__init__

    def record(self, model):
        init(self, model)
        runners.append(self)

    monkeypatch.setattr(PackedRunner, "__init__", record)
    check_schedule(model)
    assert runners[0].compiled is not None and runners[0].compiled._add_norm is False
    assert calls == []


@pytest.mark.skipif(not CUDA, reason="the kernel runs on CUDA only")
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16, mx.float32])
@pytest.mark.parametrize("rows,hidden", [(1, 2048), (7, 2048), (33, 576), (3, 1000), (2, 64)])
def test_kernel_equals_mlx_add_and_rms_norm(dtype, rows, hidden) -> None:
    kh, kd, kw = mx.random.split(mx.random.key(rows + hidden), 3)
    h = (mx.random.normal((1, rows, hidden), key=kh) * 3).astype(dtype)
    d = mx.random.normal((1, rows, hidden), key=kd).astype(dtype)
    w = (1 + 0.2 * mx.random.normal((hidden,), key=kw)).astype(dtype)
    assert add_norm.available(dtype, hidden)
    norm = nn.RMSNorm(hidden, eps=1e-6)
    norm.weight = w
    got_s, got_y = add_norm.add_norm(h, d, norm, kernel=True)
    want_s, want_y = add_norm.reference(h, d, w, 1e-6)
    assert mx.array_equal(got_s, want_s).item()
    tol = 1e-5 if dtype == mx.float32 else 2e-2
    assert mx.abs(got_y.astype(mx.float32) - want_y.astype(mx.float32)).max().item() <= tol
