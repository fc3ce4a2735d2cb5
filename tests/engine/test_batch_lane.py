"""The prefill lane (engine/batch.py): prompt chunks on a second engine thread while the decode steps go on. Output
equals mlx-lm's own generation; a chunk held on the lane holds no decoding row; a lane failure or a cancel there
touches only the lane's rows."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import anyio.to_thread
import pytest

from engine.contracts import GenerationRequest, SamplingParams
from engine.runtime import Engine
from tests.engine.test_batch import (GREEDY, assert_matches_reference, drain, iterate, make_group, prompt_of, run_rows,
                                     tokens_of)

pytestmark = pytest.mark.anyio


class GatedPrompts:
    """Wraps the group's runner: a forward over prompt chunks (no slot rows) waits for `open`, or raises `fail`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.open = threading.Event()
        self.entered = threading.Event()
        self.fail: str | None = None
        self.iterations = inner.iterations

    def forward(self, segments):
        if all(s.slot is None for s in segments) and any(len(s.tokens) > 1 for s in segments):
            self.entered.set()
            if self.fail:
                raise RuntimeError(self.fail)
            assert self.open.wait(30), "the test never opened the gate"
        return self.inner.forward(segments)


async def decoding_beside_gate(loaded, max_tokens: int):
    """A lane group whose runner is gated (open) and one row already decoding: (group, gate, that row's stream)."""
    group = make_group(loaded, prefill_lane=True)
    gate = group.step.runner = GatedPrompts(group.step.runner)
    gate.open.set()
    first = group.submit(GenerationRequest(prompt_of(6, 1), GREEDY, max_tokens=max_tokens))
    await iterate_until(group, lambda: first._row.decoding and not first._row.in_lane)
    return group, gate, first


async def iterate_until(group, done, limit: int = 400) -> None:
    for _ in range(limit):
        if done():
            return
        await iterate(group)
    raise AssertionError("not reached")


async def test_rows_prefilled_on_the_lane_match_mlx_lm_and_no_step_mixes(tiny_loaded) -> None:
    group = make_group(tiny_loaded, prefill_lane=True, max_iteration_tokens=16, minimum_preparation_tokens=4)
    try:
        prompts = [prompt_of(n, i) for i, n in enumerate((3, 11, 25, 40))]
        reqs = [GenerationRequest(p, GREEDY, max_tokens=16) for p in prompts]
        deltas = await run_rows(group, reqs, [0, 2, 5, 9])
        for p, d in zip(prompts, deltas.values()):
            assert_matches_reference(tiny_loaded, p, tokens_of(d), 16)
        # No decode step carried a prompt chunk: the chunks ran on the lane.
        assert group.counters["lane_chunks"] >= 1 and group.counters["mixed_iterations"] == 0
        assert group.iteration_times.snapshot()["mixed"]["n"] == 0
        assert group.counters["prompt_tokens"] == sum(len(p) for p in prompts)
        assert group.active_rows() == 0 and group.kv_bytes() == 0
    finally:
        group.close()


async def test_the_lane_reads_a_short_prompt_beside_a_long_ones_chunk(tiny_loaded) -> None:
    group = make_group(tiny_loaded, prefill_lane=True, max_iteration_tokens=8, minimum_preparation_tokens=4)
    try:
        long, short = prompt_of(45, 1), prompt_of(3, 2)
        first = group.submit(GenerationRequest(long, GREEDY, max_tokens=4))
        await iterate_until(group, lambda: first._row.prefilled > 0)
        second = group.submit(GenerationRequest(short, GREEDY, max_tokens=4))
        await iterate_until(group, lambda: second._row.prefilled == len(short))
        assert first._row.prefilled < len(long)  # not after the long prompt's whole prefill
        await iterate_until(group, lambda: first._row.finished and second._row.finished)
        assert_matches_reference(tiny_loaded, short, tokens_of(drain(second)), 4)
        assert_matches_reference(tiny_loaded, long, tokens_of(drain(first)), 4)
    finally:
        group.close()


async def test_a_row_prefilled_on_the_lane_reports_its_first_tokens_logprob(tiny_loaded) -> None:
    # The lane samples the first token on its own thread: the log probabilities beside it are evaluated there.
    group = make_group(tiny_loaded, prefill_lane=True)
    try:
        prompt = prompt_of(12, 2)
        asked = GenerationRequest(prompt, SamplingParams(temperature=0.0, logprobs=2), max_tokens=6)
        deltas = (await run_rows(group, [GenerationRequest(prompt_of(5, 1), GREEDY, max_tokens=6), asked],
                                 [0, 2]))[1]
        assert group.counters["lane_chunks"] >= 1
        tokens = tokens_of(deltas)
        reported = [lp for d in deltas for lp in d.logprobs]
        assert reported and reported[0].token == tokens[0] and reported[0].top[0][0] == tokens[0]
        assert len(reported) == len([t for t in tokens if t not in set(tiny_loaded.tokenizer.eos_token_ids)])
    finally:
        group.close()


async def test_decoding_rows_go_on_while_a_prompt_chunk_is_held_on_the_lane(tiny_loaded) -> None:
    group, gate, first = await decoding_beside_gate(tiny_loaded, 30)
    try:
        gate.open.clear()
        gate.entered.clear()
        second = group.submit(GenerationRequest(prompt_of(20, 2), GREEDY, max_tokens=8))
        await iterate(group)  # admitted; its chunk goes to the lane, which waits at the gate
        assert await anyio.to_thread.run_sync(gate.entered.wait, 30)
        assert second._row.in_lane
        before = len(first._row.generated)
        for _ in range(5):
            await iterate(group)
        assert len(first._row.generated) == before + 5  # one token an iteration while the chunk was held
        assert second._row.prefilled == 0 and not second._row.generated
        gate.open.set()
        await iterate_until(group, lambda: first._row.finished and second._row.finished)
        got = {s: tokens_of(drain(s)) for s in (first, second)}
        assert_matches_reference(tiny_loaded, prompt_of(6, 1), got[first], 30)
        assert_matches_reference(tiny_loaded, prompt_of(20, 2), got[second], 8)
    finally:
        gate.open.set()
        group.close()


async def test_a_failing_lane_job_fails_its_rows_and_decoding_goes_on(tiny_loaded) -> None:
    group, gate, first = await decoding_beside_gate(tiny_loaded, 12)
    try:
        gate.fail = "lane kaboom"
        second = group.submit(GenerationRequest(prompt_of(20, 2), GREEDY, max_tokens=8))
        await iterate_until(group, lambda: second._row.finished)
        (failed,) = drain(second)
        assert failed.finish_reason == "error" and "lane kaboom" in (failed.error or "")
        gate.fail = None
        await iterate_until(group, lambda: first._row.finished)
        assert_matches_reference(tiny_loaded, prompt_of(6, 1), tokens_of(drain(first)), 12)
        assert group.counters["failed_steps"] == 1 and group.health.ok
    finally:
        group.close()


async def test_a_row_cancelled_on_the_lane_leaves_when_its_job_lands(tiny_loaded) -> None:
    group = make_group(tiny_loaded, prefill_lane=True)
    gate = group.step.runner = GatedPrompts(group.step.runner)
    try:
        stream = group.submit(GenerationRequest(prompt_of(20, 3), GREEDY, max_tokens=8))
        async with anyio.create_task_group() as tg:
            tg.start_soon(iterate, group)  # waits for the lane job, held at the gate
            assert await anyio.to_thread.run_sync(gate.entered.wait, 30)
            stream.cancel()
            group.prune()
            assert group.active_rows() == 1  # the lane still owns it: its cache is in use there
            gate.open.set()
        await iterate_until(group, lambda: group.active_rows() == 0)
        assert group.counters["cancelled_rows"] == 1 and group.row_cache_bytes() == 0
    finally:
        gate.open.set()
        group.close()


async def test_a_seeded_row_samples_the_same_through_the_lane(tiny_loaded) -> None:
    seeded = SamplingParams(temperature=0.9, seed=7)
    outs = []
    for lane in (False, True):
        group = make_group(tiny_loaded, prefill_lane=lane)
        try:
            deltas = (await run_rows(group, [GenerationRequest(prompt_of(9, 4), seeded, max_tokens=12)], [0]))[0]
            outs.append(tokens_of(deltas))
        finally:
            group.close()
    assert outs[0] == outs[1] and len(outs[0]) >= 1


async def test_the_engine_serves_through_the_lane_on_its_threads(tiny_loaded) -> None:
    engine = Engine(tiny_loaded, prefill_lane=True, memory_budget=1 << 30)
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        prompts = [prompt_of(n, i) for i, n in enumerate((30, 7, 50))]
        streams = [engine.submit(GenerationRequest(p, GREEDY, max_tokens=10)) for p in prompts]
        for p, s in zip(prompts, streams):
            assert_matches_reference(tiny_loaded, p, [t async for d in s for t in d.token_ids], 10)
        lane = engine.stats()["prefill_lane"]
        assert lane["on"] and lane["chunks"] >= 1
        # Each job built its graph, launched its kernels and waited for them (the decode steps name what they met).
        assert set(lane["phase_seconds"]) == {"lane_build", "lane_launch", "lane_device"}
        assert all(v > 0 for v in lane["phase_seconds"].values())
        # and the lane thread's CPU time in each, never more than its wall time (the rest it waited)
        assert lane["phase_cpu_seconds"].keys() == lane["phase_seconds"].keys()
        assert all(0 <= lane["phase_cpu_seconds"][k] <= v + 1e-4 for k, v in lane["phase_seconds"].items())
        engine.close()


async def test_closing_while_a_chunk_is_on_the_lane_frees_a_driver_waiting_for_it(tiny_loaded) -> None:
    group = make_group(tiny_loaded, prefill_lane=True)
    gate = group.step.runner = GatedPrompts(group.step.runner)
    stream = group.submit(GenerationRequest(prompt_of(20, 5), GREEDY, max_tokens=8))
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(iterate, group)  # nothing decodes: it waits for the lane's job
            assert await anyio.to_thread.run_sync(gate.entered.wait, 30)
            group.close()
            gate.open.set()
    (delta,) = drain(stream)
    assert delta.finish_reason == "cancelled" and group.closed


async def test_a_prefix_cache_hit_and_segment_puts_go_through_the_lane(tiny_loaded) -> None:
    # The real PrefixCache shared by both threads: the lane takes a hit and stores a segment boundary mid-prompt, the
    # decode thread stores the finished row; the answer equals a cold run's. The finished row's put is still unsettled
    # when the group goes idle (its row ended with the next step in flight): on CUDA the lane may not evaluate on top
    # of the decode thread's stream, so the group has the decode thread settle it before the lane takes it.
    from engine.prefix_cache import PrefixCache

    cache = PrefixCache(1 << 26)
    group = make_group(tiny_loaded, prefill_lane=True, prefix_cache=cache, max_iteration_tokens=8,
                       minimum_preparation_tokens=4)
    try:
        first = prompt_of(12, 2)
        d1 = (await run_rows(group, [GenerationRequest(first, GREEDY, max_tokens=6, namespace="m")], [0]))[0]
        assert cache.has_pending()  # the turn's put, not yet waited for by the thread that started it
        second = first + tokens_of(d1) + prompt_of(9, 8)
        request = GenerationRequest(second, GREEDY, max_tokens=8, namespace="m", segment_boundaries=(len(second) - 4,))
        d2 = (await run_rows(group, [request], [0]))[0]
        assert d2[-1].cached_tokens == len(first) + len(tokens_of(d1)) - 1  # the hit, taken on the lane
        stats = cache.stats()
        assert stats["hits"] == 1 and stats["system_entries"] == 1  # the boundary, stored mid-prompt by the lane
        assert group.counters["mixed_iterations"] == 0
    finally:
        group.close()
    cold = make_group(tiny_loaded)
    assert tokens_of(d2) == tokens_of((await run_rows(cold, [GenerationRequest(second, GREEDY, max_tokens=8)], [0]))[0])


async def test_a_row_back_from_the_lane_feeds_its_last_prompt_token_to_the_decode_steps(tiny_loaded) -> None:
    # The lane stops before the prompt's last token; the row's first decode step feeds it and samples the first
    # token, kept in flight like its batch mates' (no read that stalls the pipeline), and the second token comes the
    # very next iteration. Sampled on the lane, the first token waited ~2.4 steps for the second (poisson8's tail).
    group, gate, first = await decoding_beside_gate(tiny_loaded, 60)
    group.step.keep_mixed = True
    prompt = prompt_of(9, 3)
    try:
        await iterate(group)  # the first row's next step in flight
        gate.open.clear()
        second = group.submit(GenerationRequest(prompt, GREEDY, max_tokens=8))
        await iterate(group)  # admitted: its prompt goes to the lane, which waits at the gate
        gate.open.set()
        await group.lane.wait()
        row = second._row
        assert (row.generated, row.last_token, row.prefilled) == ([], prompt[-1], len(prompt) - 1)
        assert row.decoding and not row.preparing and not row.in_lane and group.step.pipeline.inflight is not None
        await iterate(group)  # the step it joins stays in flight: its first token is not read yet
        flight = group.step.pipeline.inflight
        assert flight is not None and row in flight.rows and row.generated == [] and len(first._row.generated) > 1
        await iterate(group)
        assert len(row.generated) == 1 and row.prefilled == len(prompt)
        await iterate(group)
        assert len(row.generated) == 2
        await iterate_until(group, lambda: first._row.finished and row.finished)
        got = {s: tokens_of(drain(s)) for s in (first, second)}
        assert_matches_reference(tiny_loaded, prompt_of(6, 1), got[first], 60)
        assert_matches_reference(tiny_loaded, prompt, got[second], 8)
        assert group.counters["prompt_tokens"] == 6 + len(prompt)  # the last token counted when its step landed
    finally:
        group.close()


async def test_a_prefix_hit_that_leaves_only_the_last_token_goes_straight_to_the_decode_steps(tiny_loaded) -> None:
    # A turn whose prompt is the previous one's whole text: the hit covers all but the last token, which the row's
    # first decode step feeds (the lane has nothing to compute); the answer equals a cold run's.
    from engine.prefix_cache import PrefixCache

    group = make_group(tiny_loaded, prefill_lane=True, prefix_cache=PrefixCache(1 << 26))
    try:
        first = prompt_of(12, 2)
        d1 = (await run_rows(group, [GenerationRequest(first, GREEDY, max_tokens=6, namespace="m")], [0]))[0]
        again = first + tokens_of(d1)
        chunks = group.counters["lane_chunks"]
        d2 = (await run_rows(group, [GenerationRequest(again, GREEDY, max_tokens=8, namespace="m")], [0]))[0]
        assert d2[-1].cached_tokens == len(again) - 1 and d2[-1].prompt_tokens == len(again)
        assert group.counters["lane_chunks"] == chunks  # no prompt chunk was computed for it
    finally:
        group.close()
    cold = make_group(tiny_loaded)
    assert tokens_of(d2) == tokens_of((await run_rows(cold, [GenerationRequest(again, GREEDY, max_tokens=8)], [0]))[0])


async def test_the_same_prompt_again_decodes_from_a_cut_prefix_hit(tiny_loaded) -> None:
    # The second ask of a prompt hits the first turn's entry (its prompt and answer) at all but the prompt's last token:
    # the lane cuts the entry's KV to the hit and computes nothing, and the cut, built on the lane's thread, must be
    # evaluated there (the decode thread failed every such request: "There is no Stream(cpu, 2) in current thread").
    from engine.prefix_cache import PrefixCache

    group = make_group(tiny_loaded, prefill_lane=True, prefix_cache=PrefixCache(1 << 26))
    prompt = prompt_of(12, 5)
    try:
        first = (await run_rows(group, [GenerationRequest(prompt, GREEDY, max_tokens=6, namespace="m")], [0]))[0]
        again = (await run_rows(group, [GenerationRequest(prompt, GREEDY, max_tokens=6, namespace="m")], [0]))[0]
        assert again[-1].error is None and again[-1].cached_tokens == len(prompt) - 1
        assert tokens_of(again) == tokens_of(first)
    finally:
        group.close()


async def test_a_row_back_from_the_lane_has_its_second_token_from_the_step_it_joins(tiny_loaded, monkeypatch) -> None:
    # TANDEM_LANE_TAIL=off: the lane samples the first token. Steps stay in flight across iterations (as on a GPU),
    # but the one a row joins is read at once: kept in flight, its second token came an iteration later.
    monkeypatch.setenv("TANDEM_LANE_TAIL", "off")
    group, gate, first = await decoding_beside_gate(tiny_loaded, 60)
    group.step.keep_mixed = True
    try:
        await iterate(group)  # the first row's next step in flight
        gate.open.clear()
        second = group.submit(GenerationRequest(prompt_of(9, 3), GREEDY, max_tokens=8))
        await iterate(group)  # admitted: its prompt goes to the lane, which waits at the gate
        gate.open.set()
        await group.lane.wait()  # landed: the second row has its first token and is the group's again
        assert len(second._row.generated) == 1 and not second._row.in_lane and not first._row.finished
        assert group.step.pipeline.inflight is not None  # the first row's step is in flight as the second joins
        await iterate(group)
        assert len(second._row.generated) == 2
        await iterate_until(group, lambda: first._row.finished and second._row.finished)
        got = {s: tokens_of(drain(s)) for s in (first, second)}
        assert_matches_reference(tiny_loaded, prompt_of(6, 1), got[first], 60)
        assert_matches_reference(tiny_loaded, prompt_of(9, 3), got[second], 8)
    finally:
        group.close()


def test_only_a_group_with_a_lane_has_its_decode_steps_watch_the_lanes_phases(tiny_loaded) -> None:
    without, with_lane = make_group(tiny_loaded), make_group(tiny_loaded, prefill_lane=True)
    try:
        assert without.step.lane_phases is None and without.step.record.lane is None
        assert with_lane.step.lane_phases is not None and with_lane.step.record.lane is with_lane.step.lane_phases
    finally:
        without.close()
        with_lane.close()
