"""Slot KV decode: one attention call per layer whatever the number of rows, parity with per-row caches
(rows of different lengths, joining and leaving, holes), export/adopt round trips."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.utils import load

from engine import decode_attention
from engine.runner import PackedRunner, Segment, SeparateRunner, make_cache
from engine.slots import SlotKV
from tests.fixtures.tiny_llm import build_tiny_llm


def prompt_of(length: int, salt: int) -> list[int]:
    return [3 + (salt * 31 + i * 17) % 390 for i in range(length)]


def prefill(runner, model, prompt):
    cache = make_cache(model)
    runner.forward([Segment(prompt, cache, False)])
    mx.eval([a for c in cache for a in (c.keys, c.values)])
    return cache


class CountingSDPA:
    """Counts attention calls: MLX's, and on CUDA the decode kernel's (engine/decode_attention.py)."""

    def __init__(self, monkeypatch) -> None:
        self.calls = 0
        for owner, name in ((mx.fast, "scaled_dot_product_attention"), (decode_attention, "attend")):
            monkeypatch.setattr(owner, name, self._counted(getattr(owner, name)))

    def _counted(self, real):
        def counted(*args, **kw):
            self.calls += 1
            return real(*args, **kw)

        return counted


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_decode_attention_is_one_call_per_layer_whatever_the_rows(tiny_loaded, monkeypatch, rows) -> None:
    model = tiny_loaded.model
    runner = PackedRunner(model)
    slots = [runner.slots.adopt(prefill(runner, model, prompt_of(3 + 2 * i, i))) for i in range(rows)]
    runner.slots.uses_kernel()  # decided first: on CUDA the kernel's self-test calls both attentions once
    counter = CountingSDPA(monkeypatch)
    logits = runner.forward([Segment([7 + i], None, True, s) for i, s in enumerate(slots)])
    mx.eval(logits)
    assert logits.shape == (rows, model.args.vocab_size)
    assert counter.calls == len(runner.layers)


def check_schedule(model, monkeypatch=None) -> None:
    """Rows of different lengths decode through slots, join late, leave (holes), and a prompt's two chunks ride
    along; every logit row must equal mlx-lm's per-row forward."""
    packed, ref = PackedRunner(model), SeparateRunner(model)
    packed.slots.step = 8  # several capacity steps while rows of different lengths decode
    prompts = [prompt_of(n, i) for i, n in enumerate((5, 1, 12, 7, 20, 9))]
    ref_caches = [make_cache(model) for _ in prompts]
    slot_of: dict[int, int] = {}

    def join(i: int) -> None:
        slot_of[i] = packed.slots.adopt(prefill(packed, model, prompts[i]))
        mx.eval(ref.forward([Segment(prompts[i], ref_caches[i], True)]))

    def step(live: list[int], salt: int, chunk: tuple[int, list, int] | None = None) -> None:
        segs = [Segment([10 + salt + i], None, True, slot_of[i]) for i in live]
        ref_segs = [Segment([10 + salt + i], ref_caches[i], True) for i in live]
        if chunk is not None:  # a prefill chunk between decode rows: per-row path in the same forward
            j, cache, start = chunk
            segs.insert(1, Segment(prompts[j][start:start + 4], cache, True))
            ref_segs.insert(1, Segment(prompts[j][start:start + 4], ref_caches[j], True))
        got, want = packed.forward(segs), ref.forward(ref_segs)
        mx.eval(got, want)
        assert mx.allclose(got, want, atol=1e-4, rtol=1e-4).item(), float(mx.abs(got - want).max())

    for i in (0, 1, 2):
        join(i)
    step([0, 1, 2], 0)
    step([2, 0], 1)  # any order
    packed.slots.release(slot_of.pop(1))  # a hole at slot 1
    step([0, 2], 2)
    join(3)  # reuses the hole
    join(4)
    chunked = make_cache(model)
    step([4, 3, 0, 2], 3, chunk=(5, chunked, 0))
    step([0, 2, 3, 4], 4, chunk=(5, chunked, 4))  # the prompt's second chunk sees its first
    for s in range(1, 5):
        step([0, 2, 3, 4], 4 + s)
    packed.slots.release(slot_of.pop(0))
    step([3], 9)  # one row alone (scalar RoPE offset)


def test_slot_decode_matches_per_row_caches_llama(tiny_loaded) -> None:
    check_schedule(tiny_loaded.model)


def test_slot_decode_matches_per_row_caches_qwen3(tmp_path) -> None:
    model, _ = load(str(build_tiny_llm(tmp_path, model_type="qwen3")))
    check_schedule(model)


def test_capacity_grows_and_export_round_trips(tiny_loaded) -> None:
    model = tiny_loaded.model
    runner = PackedRunner(model)
    runner.slots.step = 4  # force several capacity steps
    cache = prefill(runner, model, prompt_of(6, 1))
    s = runner.slots.adopt(cache)
    for t in range(7):
        mx.eval(runner.forward([Segment([20 + t], None, True, s)]))
    assert runner.slots.length(s) == 13 and runner.slots.capacity >= 13
    assert runner.slots.slots == 1  # growing positions never adds slots (it once doubled them each time)
    exported = runner.slots.export(s)
    ref = prefill(SeparateRunner(model), model, prompt_of(6, 1) + [20 + t for t in range(7)])
    for a, b in zip(exported, ref):
        assert a.offset == b.offset == 13
        assert mx.allclose(a.keys, b.keys[..., :13, :], atol=1e-5).item()
        assert mx.allclose(a.values, b.values[..., :13, :], atol=1e-5).item()
    runner.slots.release(s)
    assert runner.slots.nbytes == 0 and runner.slots.slots == 0


def test_slot_segments_are_checked(tiny_loaded) -> None:
    runner = PackedRunner(tiny_loaded.model)
    s = runner.slots.adopt(prefill(runner, tiny_loaded.model, [5, 6, 7]))
    with pytest.raises(ValueError):
        runner.forward([Segment([1, 2], None, True, s)])
    with pytest.raises(ValueError):
        SlotKV(2).adopt([])


@pytest.mark.anyio
async def test_group_rows_join_leave_and_cancel_through_slots(tiny_loaded) -> None:
    from engine.contracts import GenerationRequest, SamplingParams
    from tests.engine.test_batch import assert_matches_reference, drain, iterate, make_group, tokens_of

    group = make_group(tiny_loaded, max_active=8)
    prompts = [prompt_of(n, i) for i, n in enumerate((4, 19, 1, 33, 9, 14))]
    greedy = SamplingParams(temperature=0.0)
    streams, deltas = {}, {i: [] for i in range(len(prompts))}
    join_at, victim = [0, 0, 1, 3, 4, 6], 3
    for it in range(200):
        for i, at in enumerate(join_at):
            if at == it:
                streams[i] = group.submit(GenerationRequest(prompts[i], greedy, max_tokens=12 + i))
        if it == 8:
            row = next(r for r in group._active if r.prompt == prompts[victim])
            assert row.slot is not None and row.cache is None  # decoding from its slot
            await streams.pop(victim).aclose()
        await iterate(group)
        if it == 8:
            assert row.slot is None and row.slot not in group.step.slots.lengths
            assert len(group.step.slots.lengths) == group.running_tokens()
        for i, s in streams.items():
            deltas[i] += drain(s)
        if all(deltas[i] and deltas[i][-1].finish_reason for i in streams):
            break
    for i, p in enumerate(prompts):
        if i != victim:
            assert_matches_reference(tiny_loaded, p, tokens_of(deltas[i]), 12 + i)
    assert group.active_rows() == 0 and group.kv_bytes() == 0 and group.step.slots.nbytes == 0
