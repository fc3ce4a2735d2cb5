"""DecodePipeline inside LLMBatchGroup: step N+1 launched before step N's tokens are read; rows that stop
or are cancelled mid-pipeline give the same tokens/text as without it, and hand the right KV length on."""

from __future__ import annotations

from typing import Any

import pytest

from engine.contracts import GenerationRequest, SamplingParams
from tests.engine.test_batch import (
    FakePrefixCache, assert_matches_reference, drain, iterate, make_group, prompt_of, reference, run_rows, tokens_of,
)

pytestmark = pytest.mark.anyio
GREEDY = SamplingParams(temperature=0.0)


def pipelined_group(loaded, **kw):
    """A group that keeps mixed steps in flight, as it does on a GPU with the prefill lane off (make_group's)."""
    return make_group(loaded, keep_mixed_in_flight=True, **kw)


async def run_checked(group, loaded, sizes: tuple[int, ...], limits: tuple[int, ...], starts: list[int]):
    """Greedy rows with prompts of `sizes` and `limits` tokens, each joining at its start iteration; every row
    must give mlx-lm's tokens. Returns their deltas."""
    prompts = [prompt_of(n, i) for i, n in enumerate(sizes)]
    deltas = await run_rows(group, [GenerationRequest(p, GREEDY, max_tokens=m) for p, m in zip(prompts, limits)],
                            starts)
    for i, p in enumerate(prompts):
        assert_matches_reference(loaded, p, tokens_of(deltas[i]), limits[i])
    return deltas


def test_mixed_steps_stay_in_flight_by_default_only_on_a_gpu(tiny_loaded) -> None:
    import mlx.core as mx

    assert make_group(tiny_loaded).step.keep_mixed == (mx.default_device().type == mx.DeviceType.gpu)


def spy(group) -> list[tuple[str, int]]:
    """Record ("launch", id(tokens)) as a step starts (built and started in one call, or started after its build) and
    ("build", id(tokens)) and ("read", id(tokens)), in call order."""
    events: list[tuple[str, int]] = []
    pipe = group.step.pipeline
    launch, build, start, read = pipe.launch, pipe.build, pipe.start, pipe.read

    alive: list[object] = []  # arrays seen stay referenced, so no later array reuses their id

    def launch_spy(rows, fed):
        out = build(rows, fed)  # the unspied build and start: one launch event
        start(out)
        alive.append(out[0])
        events.append(("launch", id(out[0])))
        return out[0]

    def build_spy(rows, fed):
        out = build(rows, fed)
        alive.append(out[0])
        events.append(("build", id(out[0])))
        return out

    def start_spy(wanted):
        start(wanted)
        events.append(("launch", id(wanted[0])))

    def read_spy(tokens):
        alive.append(tokens)
        events.append(("read", id(tokens)))
        return read(tokens)

    pipe.launch, pipe.build, pipe.start, pipe.read = launch_spy, build_spy, start_spy, read_spy
    return events


@pytest.mark.parametrize("read_first", [False, True])
async def test_next_step_is_built_before_the_current_tokens_are_read(tiny_loaded, read_first: bool) -> None:
    group = pipelined_group(tiny_loaded)
    group.step.pipeline.read_first = read_first
    events = spy(group)
    streams = [group.submit(GenerationRequest(prompt_of(n, n), GREEDY, max_tokens=12)) for n in (5, 8)]
    for _ in range(6):
        await iterate(group)
    reads = [i for i, (kind, _) in enumerate(events) if kind == "read"]
    assert len(reads) >= 3
    for i in reads:
        launched = [t for kind, t in events[:i] if kind == "launch"]
        assert events[i][1] in launched  # the array read now was started earlier
        kind, later = events[i - 1]
        assert kind == ("build" if read_first else "launch") and later != events[i][1]  # the step fed from it
        if read_first:  # a CPU starts the next step only after the read (its start returns once it is nearly done)
            assert events[i + 1] == ("launch", later)
    for s in streams:
        s.cancel()


async def test_tokens_read_first_reach_the_stream_before_the_next_step_starts(tiny_loaded) -> None:
    group = make_group(tiny_loaded)
    group.step.pipeline.read_first = True
    pipe = group.step.pipeline
    start = pipe.start
    stream = group.submit(GenerationRequest(prompt_of(6, 1), GREEDY, max_tokens=24))
    got: list[int] = []
    lag: list[int] = []

    def start_spy(wanted):
        got.extend(t for d in drain(stream) for t in d.token_ids)
        row = stream._row
        lag.append(len(row.generated) - len(row.unsent_ids) - len(got))  # shown but not yet in the stream
        start(wanted)

    pipe.start = start_spy  # type: ignore[method-assign]
    while not row_done(stream):
        await iterate(group)
        got.extend(t for d in drain(stream) for t in d.token_ids)
    assert len(lag) >= 10 and lag == [0] * len(lag)
    assert len(got) == 24 and group.counters["generation_tokens"] == 24


@pytest.mark.parametrize("end", ["length", "stop"])
async def test_a_finishing_rows_last_delta_goes_out_before_its_next_step_runs(tiny_loaded, monkeypatch, end) -> None:
    # Read first (a CPU), the next step is built before a row's token is read; the row's prefix-cache copy reads KV
    # that step writes, so starting it at the put ran the step before the row's last delta went out (a token late).
    import mlx.core as mx

    from engine.prefix_cache import PrefixCache

    cache = PrefixCache(1 << 26)
    group = make_group(tiny_loaded, prefix_cache=cache)
    group.step.pipeline.read_first = True
    prompt = prompt_of(7, 2)
    ref = reference(tiny_loaded.model, prompt, 8)
    stop_ids = (ref[5],) if end == "stop" else ()
    assert end == "length" or ref[5] not in ref[:5]
    stream = group.submit(GenerationRequest(prompt, GREEDY, max_tokens=6, stop_token_ids=stop_ids))
    got: list = []
    late: list[str] = []  # evaluations that ran while the finished row's last delta was still held
    for name in ("eval", "async_eval"):
        def spy(*arrays, _name=name, _real=getattr(mx, name)):
            got.extend(drain(stream))
            if stream._row.finished and not any(d.finish_reason for d in got):
                late.append(_name)
            return _real(*arrays)
        monkeypatch.setattr(mx, name, spy)
    while not row_done(stream):
        await iterate(group)
    got.extend(drain(stream))
    monkeypatch.undo()
    assert late == []
    assert [d.finish_reason for d in got][-1] == end and tokens_of(got) == ref[:6]
    assert got[-1].cache_write_tokens > 0  # the put still counted on the last delta
    cache.settle()
    assert cache.take("", prompt + ref[:5] + [1], None)[0] > len(prompt)  # and its entry is takeable


def row_done(stream) -> bool:
    return stream._row.finished


async def test_rows_of_different_lengths_match_mlx_lm_with_the_pipeline(tiny_loaded) -> None:
    group = pipelined_group(tiny_loaded)
    events = spy(group)
    await run_checked(group, tiny_loaded, (5, 9, 14, 3), (7, 12, 20, 4), [0, 0, 0, 0])
    assert sum(kind == "read" for kind, _ in events) >= 10
    group.prune()
    assert group.step.pipeline.inflight is None  # nothing left to read: the old step is not kept


async def run_pair(loaded, pipelined: bool, stop: list[str] | None = None) -> tuple[Any, FakePrefixCache]:
    cache = FakePrefixCache()
    group = make_group(loaded, prefix_cache=cache)
    group.step.pipeline.enabled = pipelined
    prompt = loaded.tokenizer.encode("The quick brown fox")
    requests = [GenerationRequest(prompt, GREEDY, max_tokens=9, namespace="m", session_id="a", stop=stop or []),
                GenerationRequest(prompt_of(6, 2), GREEDY, max_tokens=25, namespace="m", session_id="b")]
    return await run_rows(group, requests, [0, 0]), cache


async def test_a_row_stopping_mid_pipeline_gives_the_same_output_and_kv_length(tiny_loaded) -> None:
    plain, plain_cache = await run_pair(tiny_loaded, pipelined=False)
    piped, piped_cache = await run_pair(tiny_loaded, pipelined=True)
    for a, b in zip(plain.values(), piped.values()):
        assert [(d.text, d.token_ids, d.finish_reason) for d in a] == [(d.text, d.token_ids, d.finish_reason)
                                                                      for d in b]
    # FakePrefixCache.put checks every layer's offset equals the tokens stored (prompt + generated - 1).
    assert [t for t, _ in piped_cache.entries] == [t for t, _ in plain_cache.entries]
    full = "".join(d.text for d in piped[0])
    stop = next(full[i : i + 2] for i in range(3, len(full)) if full[i : i + 2].isalpha())
    plain_stop, _ = await run_pair(tiny_loaded, pipelined=False, stop=[stop])
    piped_stop, _ = await run_pair(tiny_loaded, pipelined=True, stop=[stop])
    assert piped_stop[0][-1].finish_reason == "stop"
    assert "".join(d.text for d in piped_stop[0]) == "".join(d.text for d in plain_stop[0])


async def test_second_turn_from_a_pipelined_first_turn_matches_cold(tiny_loaded) -> None:
    cache = FakePrefixCache()
    group = pipelined_group(tiny_loaded, prefix_cache=cache)
    first = prompt_of(10, 3)
    d = await run_rows(group, [GenerationRequest(first, GREEDY, max_tokens=5, namespace="m", session_id="s"),
                               GenerationRequest(prompt_of(4, 9), GREEDY, max_tokens=30)], [0, 0])
    gen = tokens_of(d[0])
    second = first + gen + prompt_of(4, 6)
    warm = (await run_rows(group, [GenerationRequest(second, GREEDY, max_tokens=8, namespace="m", session_id="s")],
                           [0]))[0]
    assert warm[-1].cached_tokens == len(first) + len(gen) - 1
    assert_matches_reference(tiny_loaded, second, tokens_of(warm), 8)


async def test_cancel_mid_pipeline_frees_the_row_and_stores_only_fed_kv(tiny_loaded) -> None:
    cache = FakePrefixCache()
    group = pipelined_group(tiny_loaded, prefix_cache=cache)
    prompts = [prompt_of(7, 1), prompt_of(4, 2)]
    victim, other = (group.submit(GenerationRequest(p, GREEDY, max_tokens=30)) for p in prompts)
    got: list[int] = []
    for _ in range(5):
        await iterate(group)
        got += tokens_of(drain(other))
    row = group._active[0]
    assert group.step.pipeline.inflight is not None and row in group.step.pipeline.inflight.rows
    n_generated = len(row.generated)
    await victim.aclose()
    await iterate(group)
    assert row not in group._active and row.slot is None and row.cache is None
    assert [len(t) for t, _ in cache.entries] == [7 + n_generated - 1]
    for _ in range(40):
        await iterate(group)
        got += tokens_of(drain(other))
    assert_matches_reference(tiny_loaded, prompts[1], got, 30)


async def test_a_mixed_iteration_goes_on_from_the_in_flight_step(tiny_loaded) -> None:
    # Rows decode with a step in flight; new prompts arrive. The mixed iteration's forward is built before the
    # in-flight tokens are read, and every row still gives mlx-lm's tokens (one stops on an in-flight token).
    group = pipelined_group(tiny_loaded, max_iteration_tokens=24, minimum_preparation_tokens=8)
    events = spy(group)
    forward = group.step.runner.forward

    def forward_spy(segments):
        events.append(("forward-lazy" if any(s.fed is not None for s in segments)
                       and any(s.slot is None for s in segments) else "forward", 0))
        return forward(segments)

    group.step.runner.forward = forward_spy
    await run_checked(group, tiny_loaded, (5, 9, 40, 33), (6, 30, 12, 9), [0, 0, 4, 7])
    chained = [i for i, (kind, _) in enumerate(events) if kind == "forward-lazy"]
    assert chained, "no mixed iteration went on from an in-flight step"
    for i in chained:  # the in-flight tokens are read after the forward that consumes them lazily
        assert events[i + 1][0] == "read"


async def test_chained_mixed_iterations_hand_the_same_kv_to_the_prefix_cache(tiny_loaded) -> None:
    async def run(pipelined: bool) -> tuple[dict[int, list[Any]], FakePrefixCache]:
        cache = FakePrefixCache()
        group = pipelined_group(tiny_loaded, prefix_cache=cache, max_iteration_tokens=16, minimum_preparation_tokens=8)
        group.step.pipeline.enabled = pipelined
        requests = [GenerationRequest(prompt_of(n, i), GREEDY, max_tokens=m, namespace="m", session_id=str(i))
                    for i, (n, m) in enumerate(((6, 5), (7, 20), (30, 6), (25, 4)))]
        return await run_rows(group, requests, [0, 0, 3, 5]), cache

    plain, plain_cache = await run(False)
    piped, piped_cache = await run(True)
    for a, b in zip(plain.values(), piped.values()):
        assert [(d.text, d.token_ids, d.finish_reason) for d in a] == [(d.text, d.token_ids, d.finish_reason)
                                                                      for d in b]
    # FakePrefixCache.put checks every layer's offset equals the tokens stored.
    assert sorted(t for t, _ in piped_cache.entries) == sorted(t for t, _ in plain_cache.entries)


def spy_launches(group) -> list[tuple[str, int, int]]:
    """Record ("launch", id(tokens), prompt tokens) for each general launch and ("read", id(tokens), 0) in call
    order."""
    events: list[tuple[str, int, int]] = []
    step, pipe = group.step, group.step.pipeline
    launch, read = step._launch, pipe.read
    alive: list[object] = []  # arrays seen stay referenced, so no later array reuses their id

    def launch_spy(plan, lazy):
        out = launch(plan, lazy)
        alive.append(out.tokens)
        events.append(("launch", id(out.tokens), out.prompt_tokens))
        return out

    def read_spy(tokens):
        alive.append(tokens)
        events.append(("read", id(tokens), 0))
        return read(tokens)

    step._launch, pipe.read = launch_spy, read_spy
    return events


async def test_mixed_iterations_stay_in_flight_and_the_next_goes_on_from_them(tiny_loaded) -> None:
    # A long prompt is prefilled in chunks beside decoding rows: each mixed step is read only after the next
    # one is launched (fed its tokens lazily), the row whose prompt completes decodes next from its unread first
    # token, and every row still gives mlx-lm's tokens.
    group = pipelined_group(tiny_loaded, max_iteration_tokens=16, minimum_preparation_tokens=8)
    events = spy_launches(group)
    shared: list[bool] = []  # per mixed forward with lazy decode rows: one array feeds them all
    forward = group.step.runner.forward

    def forward_spy(segments):
        fed = [s.fed for s in segments if s.fed is not None]
        if len(fed) > 1 and any(s.slot is None for s in segments):
            shared.append(all(f is fed[0] for f in fed))
        return forward(segments)

    group.step.runner.forward = forward_spy
    await run_checked(group, tiny_loaded, (5, 7, 60, 41), (30, 25, 12, 9), [0, 0, 3, 5])
    mixed = {t for kind, t, n in events if kind == "launch" and n > 0}
    reads = [i for i, (kind, t, _) in enumerate(events) if kind == "read" and t in mixed]
    assert len(reads) >= 4, "mixed steps were not kept in flight"
    for i in reads:
        at = next(j for j, (kind, t, _) in enumerate(events) if kind == "launch" and t == events[i][1])
        assert any(kind == "launch" for kind, _, _ in events[at + 1 : i]), "a mixed step was read before the next launch"
    assert any(shared), "decode rows of a chained mixed step were fed one slice each"
    group.prune()
    assert group.step.pipeline.inflight is None


async def test_a_row_whose_first_token_is_in_flight_goes_on_after_its_batch_mates_leave(tiny_loaded) -> None:
    # Both at once: the mate completes its prompt first, then decodes beside the late row's last chunk, a mixed step
    # launched with no step in flight and kept (a row joining a step in flight has it read at once). Chunks of 15 from
    # the start (an unmeasured pacer begins at the minimum): 15 + 5 for the late row.
    group = pipelined_group(tiny_loaded, max_iteration_tokens=16, minimum_preparation_tokens=15)
    mate = group.submit(GenerationRequest(prompt_of(5, 1), GREEDY, max_tokens=60))
    late_prompt = prompt_of(20, 4)
    late = group.submit(GenerationRequest(late_prompt, GREEDY, max_tokens=10))
    row = group._queue[-1]
    for _ in range(20):
        await iterate(group)
        if row.token_in_flight and not row.generated:
            break
    assert row.token_in_flight and not row.generated, "the completing step was not kept in flight"
    assert group.has_decoding() and not group.has_preparing()
    await mate.aclose()
    got: list[int] = []
    for _ in range(30):
        await iterate(group)
        got += tokens_of(drain(late))
        if not group.has_work():
            break
    assert not group.has_work()
    assert_matches_reference(tiny_loaded, late_prompt, got, 10)


async def test_rows_with_history_dependent_sampling_read_each_mixed_step_at_once(tiny_loaded) -> None:
    # A repetition penalty samples from the row's history: a step must be read before the next one samples.
    penalty = SamplingParams(temperature=0.0, repetition_penalty=1.3)
    requests = [GenerationRequest(prompt_of(6, 1), penalty, max_tokens=20),
                GenerationRequest(prompt_of(40, 2), GREEDY, max_tokens=6)]
    group = pipelined_group(tiny_loaded, max_iteration_tokens=16, minimum_preparation_tokens=8)
    kept: list[bool] = []
    keep = group.step._keep

    def keep_spy(launch):
        kept.append(keep(launch))
        return kept[-1]

    group.step._keep = keep_spy
    together = await run_rows(group, requests, [0, 2])
    assert kept and not any(kept)
    alone = await run_rows(pipelined_group(tiny_loaded), requests[:1], [0])
    assert tokens_of(together[0]) == tokens_of(alone[0])
    assert_matches_reference(tiny_loaded, requests[1].prompt_tokens, tokens_of(together[1]), 6)


async def test_rows_leaving_do_not_stop_the_pipeline_and_the_slots_still_shrink(tiny_loaded) -> None:
    # A row that finishes changes the decode rows; the next step is still launched before the last one is read
    # (rows leave three times here), and the slot buffers still shrink as rows leave, also without a read first.
    group = pipelined_group(tiny_loaded)
    unread: set[int] = set()
    exposed: list[int] = []
    pipe, step, slots = group.step.pipeline, group.step, group.step.slots
    build, launch_plan, land, read, compact = pipe.build, step._launch, step._land, pipe.read, slots.compact
    compactions: list[int] = []
    alive: list[object] = []  # arrays seen stay referenced, so no later array reuses their id

    def build_spy(rows, fed):  # built counts as launched: a CPU reads first and starts the next step right after
        out = build(rows, fed)
        alive.append(out[0])
        unread.add(id(out[0]))
        return out

    def launch_plan_spy(plan, lazy):
        out = launch_plan(plan, lazy)
        if out.tokens is not None:
            alive.append(out.tokens)
            unread.add(id(out.tokens))
        return out

    def land_spy(launched):  # waited for at once: not a step in flight
        unread.discard(id(launched.tokens))
        return land(launched)

    def read_spy(tokens):
        alive.append(tokens)
        unread.discard(id(tokens))
        if not unread:
            exposed.append(1)
        return read(tokens)

    def compact_spy():
        compactions.append(1)
        return compact()

    pipe.build, step._launch, step._land, pipe.read, slots.compact = (build_spy, launch_plan_spy, land_spy, read_spy,
                                                                      compact_spy)
    await run_checked(group, tiny_loaded, (5, 6, 7, 8), (6, 11, 16, 40), [0, 0, 0, 0])
    assert compactions, "the slot buffers never shrank"
    assert len(compactions) < 3
    # No step was read with nothing launched after it: neither a row leaving nor the buffers shrinking stops it.
    assert not exposed, f"{len(exposed)} step(s) read with nothing launched after them"


@pytest.mark.parametrize("seed", range(8))
async def test_random_joins_and_cancels_with_steps_in_flight_keep_every_survivor_exact(tiny_loaded, seed) -> None:
    # The GPU's default (mixed steps kept in flight) under rows joining, prefilling in chunks, stopping and being
    # cancelled at random iterations: every row that runs to its end gives mlx-lm's tokens, and nothing is left.
    # Half the seeds keep a prefix cache, whose puts check that each stored KV holds exactly the fed tokens.
    import random

    rnd = random.Random(seed)
    cache = FakePrefixCache() if seed % 2 else None
    group = pipelined_group(tiny_loaded, max_iteration_tokens=rnd.choice((12, 24)), minimum_preparation_tokens=4,
                            prefix_cache=cache)
    n = 6
    prompts = [prompt_of(rnd.randint(3, 40), 10 * seed + i) for i in range(n)]
    limits = [rnd.randint(2, 24) for _ in range(n)]
    join_at = sorted(rnd.randint(0, 12) for _ in range(n))
    cancel_at = {i: rnd.randint(join_at[i] + 1, join_at[i] + 10) for i in rnd.sample(range(n), 2)}
    streams: dict[int, Any] = {}
    got: dict[int, list[int]] = {i: [] for i in range(n)}
    for it in range(300):
        for i in range(n):
            if join_at[i] == it:
                streams[i] = group.submit(GenerationRequest(prompts[i], GREEDY, max_tokens=limits[i], namespace="m",
                                                            session_id=str(i)))
            if cancel_at.get(i) == it and i in streams:
                streams[i].cancel()
        await iterate(group)
        for i, s in streams.items():
            if i not in cancel_at or it < cancel_at[i]:
                got[i] += tokens_of(drain(s))
        if len(streams) == n and not group.has_work():
            break
    assert not group.has_work()
    assert cache is None or cache.entries  # finished and cancelled rows handed their KV on
    group.prune()  # the driver's next prune drops a step whose rows all ended
    assert group.step.pipeline.inflight is None
    assert group.step.slots is not None and not group.step.slots.lengths  # every slot given back
    for i in range(n):
        if i not in cancel_at:
            assert_matches_reference(tiny_loaded, prompts[i], got[i], limits[i])


async def test_prompt_tokens_and_mixed_steps_count_once_each_with_steps_in_flight(tiny_loaded) -> None:
    # A mixed step kept in flight and read by an iteration whose own step is read at once (a row joined in it)
    # delivers two steps' prompt chunks in one iteration: /stats must count both.
    group = pipelined_group(tiny_loaded, max_iteration_tokens=8, minimum_preparation_tokens=4)
    sizes = (3, 11, 25, 40)
    await run_checked(group, tiny_loaded, sizes, (16, 16, 16, 16), [0, 2, 5, 9])
    mixed = [it for it, m in zip(group.step.runner.iterations, group.step.runner.mixed) if m]
    assert len(mixed) >= 2
    assert group.counters["prompt_tokens"] == sum(sizes)
    assert group.counters["mixed_iterations"] == len(mixed)


async def test_a_pipelined_steps_record_splits_its_launches_into_build_and_launch_by_wall_and_cpu(tiny_loaded) -> None:
    # Wall time a thread did not spend on its CPU was a wait (the GIL, a lock): /stats tells the two apart per step.
    group = pipelined_group(tiny_loaded)
    costs: list[Any] = []
    record_cost = group.step._cost

    def capture(*args: Any) -> Any:
        costs.append(record_cost(*args))
        return costs[-1]

    group.step._cost = capture
    streams = [group.submit(GenerationRequest(prompt_of(n, n), GREEDY, max_tokens=8)) for n in (5, 8)]
    for _ in range(6):
        await iterate(group)
    parts = ("pipeline_build", "pipeline_build_cpu", "pipeline_launch", "pipeline_launch_cpu")
    pipelined = [c.phases for c in costs if "pipeline" in c.phases]
    assert pipelined
    for phases in pipelined:
        assert set(parts) <= phases.keys()
        for part in ("pipeline_build", "pipeline_launch"):
            assert 0 <= phases[f"{part}_cpu"] <= phases[part] + 1e-4
        assert phases["pipeline_build"] + phases["pipeline_launch"] <= phases["pipeline"] + 1e-6
    for s in streams:
        s.cancel()


@pytest.mark.parametrize("keep_mixed", [True, False])
async def test_the_decode_threads_launches_run_with_the_short_switch_interval(tiny_loaded, monkeypatch, keep_mixed) -> None:
    # Other threads give the GIL back quickly while a step launches (engine/gil.py), and only then.
    import sys

    import mlx.core as mx

    from engine.gil import QuickReturn

    group = make_group(tiny_loaded, keep_mixed_in_flight=keep_mixed)
    group.step.pipeline.quick_return = QuickReturn(0.0002)
    seen: list[float] = []
    launch = mx.async_eval

    def spy(*args: Any) -> None:
        seen.append(sys.getswitchinterval())
        launch(*args)

    monkeypatch.setattr(mx, "async_eval", spy)
    before = sys.getswitchinterval()
    streams = [group.submit(GenerationRequest(prompt_of(n, n), GREEDY, max_tokens=6)) for n in (5, 9)]
    for _ in range(8):
        await iterate(group)
    assert len(seen) >= 4 and all(s == pytest.approx(0.0002) for s in seen), seen
    assert sys.getswitchinterval() == before
    for s in streams:
        s.cancel()
