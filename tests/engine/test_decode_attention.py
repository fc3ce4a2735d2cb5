"""The decode attention kernel's path through SlotKV: each row attends its own slot up to its own length.
Off a CUDA device the kernel is off and its place is taken by its row-by-row yardstick, which checks the
path's slots and lengths against mlx-lm's per-row caches; on CUDA the kernel itself is checked against MLX's
attention row by row."""

from __future__ import annotations

import random

import mlx.core as mx
import pytest

from engine import decode_attention
from engine.runner import PackedRunner, Segment
from engine.slots import SlotKV
from tests.engine.test_slots import check_schedule, prefill, prompt_of

CUDA = mx.default_device().type == mx.DeviceType.gpu and mx.cuda.is_available()


def through_reference(monkeypatch) -> list[tuple[list[int], list[int]]]:
    """Route SlotKV's kernel path to `reference`; returns the (slots, lengths) of each call. Steps run built, not
    compiled: `reference` reads the lengths on the host."""
    monkeypatch.setenv("TANDEM_DECODE_COMPILE", "off")
    calls: list[tuple[list[int], list[int]]] = []

    def attend(q, keys, values, slots, lens, scale):
        s, n = slots.tolist(), lens.tolist()
        calls.append((s, n))
        return decode_attention.reference(q, keys, values, s, n, scale)

    monkeypatch.setattr(SlotKV, "uses_kernel", lambda self: True)
    monkeypatch.setattr(decode_attention, "attend", attend)
    return calls


def test_the_kernel_is_off_without_cuda() -> None:
    if CUDA:
        pytest.skip("a CUDA device")
    assert not decode_attention.available(mx.bfloat16, 64, 4)


def test_kernel_path_rows_match_per_row_caches(tiny_loaded, monkeypatch) -> None:
    # Holes, rows in any order, a prefill chunk alongside: a wrong slot or an off-by-one length changes logits.
    calls = through_reference(monkeypatch)
    check_schedule(tiny_loaded.model)
    assert calls, "the kernel path was not taken"
    assert any(sorted(s) != s for s, _ in calls) or any(len(set(n)) > 1 for _, n in calls)


def test_kernel_path_attends_each_row_to_its_length_after_the_new_token(tiny_loaded, monkeypatch) -> None:
    calls = through_reference(monkeypatch)
    model = tiny_loaded.model
    runner = PackedRunner(model)
    a = runner.slots.adopt(prefill(runner, model, prompt_of(5, 1)))
    b = runner.slots.adopt(prefill(runner, model, prompt_of(9, 2)))
    mx.eval(runner.forward([Segment([7], None, True, b), Segment([8], None, True, a)]))
    assert calls[0] == ([a, b], [6, 10])  # slot order; each length counts the token just written
    assert len(calls) == len(runner.layers)


def test_one_row_keeps_mlx_attention(tiny_loaded, monkeypatch) -> None:
    # A lone row needs no mask: MLX's fused vector kernel serves it.
    calls = through_reference(monkeypatch)
    runner = PackedRunner(tiny_loaded.model)
    s = runner.slots.adopt(prefill(runner, tiny_loaded.model, prompt_of(5, 1)))
    mx.eval(runner.forward([Segment([7], None, True, s)]))
    assert calls == []


@pytest.mark.skipif(not CUDA, reason="the kernel runs on CUDA only")
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16, mx.float32])
@pytest.mark.parametrize("head_dim,heads,kv_heads", [(64, 32, 8), (128, 32, 8), (64, 8, 8), (32, 4, 2)])
def test_kernel_equals_mlx_attention_row_by_row(dtype, head_dim, heads, kv_heads) -> None:
    rng = random.Random(head_dim + heads)
    rows, n_slots, cap = 9, 12, 700
    slots = rng.sample(range(n_slots), rows)
    lengths = [1, 2, 31, 32, 33, 255, 256, 513, 700]
    kk, kv, kq = mx.random.split(mx.random.key(3), 3)
    k = mx.random.normal((n_slots, kv_heads, cap, head_dim), key=kk).astype(dtype)
    v = mx.random.normal((n_slots, kv_heads, cap, head_dim), key=kv).astype(dtype)
    q = mx.random.normal((rows, heads, 1, head_dim), key=kq).astype(dtype)
    assert decode_attention.available(dtype, head_dim, heads // kv_heads)
    got = decode_attention.attend(q, k, v, mx.array(slots, dtype=mx.int32), mx.array(lengths, dtype=mx.int32), 0.125)
    want = decode_attention.reference(q, k, v, slots, lengths, 0.125)
    tol = 1e-4 if dtype == mx.float32 else 2e-2
    assert mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item() <= tol
    # As the steps pass q: a strided view of a projection that holds k's and v's heads after q's.
    qkv = mx.concatenate([q, mx.random.normal((rows, 2 * kv_heads, 1, head_dim), key=kk).astype(dtype)], axis=1)
    got = decode_attention.attend(qkv[:, :heads], k, v, mx.array(slots, dtype=mx.int32),
                                  mx.array(lengths, dtype=mx.int32), 0.125)
    assert got.shape == q.shape
    assert mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item() <= tol

