"""Decode bursts (engine/burst.py `DecodeBursts`): the engine thread runs decode steps back to back while nothing
else waits, streams each step's tokens meanwhile, and hands the loop back within one step when a request,
a task (a Whisper step) or a cancel arrives. Real engine thread, tiny llama."""

from __future__ import annotations

from typing import Any, Callable

import anyio
import pytest

from engine.contracts import GenerationRequest
from engine.runtime import Engine
from tests.engine.test_runtime import GREEDY, prompt_of, reference

pytestmark = pytest.mark.anyio


class StepLog:
    """Counts the engine's steps and its hand-offs from the event loop, and records why each burst step ended its
    burst or not (`ends`); `check` runs at each step's start."""

    def __init__(self, engine: Engine, check: Callable[[list[Any]], None] = lambda rows: None) -> None:
        self.steps = 0
        self.handoffs = 0
        self.ends: list[str | None] = []
        step_run, thread_run, why = engine.group.step.run, engine.thread.run, engine.group.bursts.end

        def step(rows: list[Any], *args: Any) -> Any:
            self.steps += 1
            check(rows)
            return step_run(rows, *args)

        async def handoff(fn: Any, *args: Any) -> Any:
            self.handoffs += 1
            return await thread_run(fn, *args)

        def burst_end(posted: Any, lane_jobs: int) -> str | None:
            self.ends.append(reason := why(posted, lane_jobs))
            return reason

        engine.group.step.run = step  # type: ignore[method-assign]
        engine.thread.run = handoff  # type: ignore[method-assign]
        engine.group.bursts.end = burst_end  # type: ignore[method-assign]

    @property
    def planned_handoffs(self) -> int:
        """Hand-offs less the bursts that ended because the loop had not yet published (this machine's load)."""
        return self.handoffs - self.ends.count("behind")


async def generate(engine: Engine, prompt: list[int], n: int, on_delta: Callable[[], None] = lambda: None) -> list[int]:
    got: list[int] = []
    async with engine.submit(GenerationRequest(prompt, GREEDY, max_tokens=n)) as stream:
        async for delta in stream:
            got += delta.token_ids
            on_delta()
    return got


async def serve_one(engine: Engine, tiny_loaded: Any, prompt: list[int], n: int,
                    before: Callable[[], Any] | None = None) -> None:
    """Serve `engine`, run `before` (awaited) and one greedy generation, close; the tokens must be mlx-lm's."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        if before is not None:
            await before()
        got = await generate(engine, prompt, n)
        engine.close()
    assert got == reference(tiny_loaded.model, prompt, n)


async def with_a_second_request(engine: Engine, tiny_loaded: Any, first: list[int], second: list[int], n: int,
                                submitted: Callable[[Any], None]) -> list[int]:
    """Serve `engine`: 40 greedy tokens of `first`, and after its fourth delta a request for `n` tokens of `second`
    (its row handed to `submitted` as it is queued); both must be mlx-lm's tokens. Returns the second's tokens."""
    seen: list[int] = []
    got: dict[str, list[int]] = {}

    async def collect() -> None:
        stream = engine.submit(GenerationRequest(second, GREEDY, max_tokens=n))
        submitted(stream._row)  # queued: steps from here on see it
        async with stream:
            got["second"] = [t async for d in stream for t in d.token_ids]

    def progress() -> None:
        seen.append(1)
        if len(seen) == 4:
            tg.start_soon(collect)

    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        got["first"] = await generate(engine, first, 40, progress)
        while "second" not in got:
            await anyio.wait_all_tasks_blocked()
        engine.close()
    assert got["first"] == reference(tiny_loaded.model, first, 40)
    assert got["second"] == reference(tiny_loaded.model, second, n)
    return got["second"]


@pytest.mark.parametrize("burst", [1, 16])
async def test_a_lone_stream_decodes_in_bursts_and_matches_mlx_lm(tiny_loaded, burst: int) -> None:
    engine = Engine(tiny_loaded, decode_burst=burst)
    log = StepLog(engine)
    await serve_one(engine, tiny_loaded, prompt_of(7, 3), 48)
    bursts = engine.stats()["decode_bursts"]  # what /stats shows
    if burst == 1:
        assert log.handoffs >= log.steps  # every step handed back to the event loop
        assert bursts == {"limit": 1, "bursts": 0, "steps": 0}
    else:  # 48 tokens: the prefill, then decode steps in bursts of up to 16 per hand-off
        assert log.steps >= 47 and log.planned_handoffs <= 2 + log.steps // 8
        assert bursts["limit"] == 16 and 3 <= bursts["bursts"] <= 6 and bursts["steps"] >= 40


async def test_a_burst_yields_to_a_new_request_within_one_step(tiny_loaded) -> None:
    engine = Engine(tiny_loaded, decode_burst=64)
    queued: list[Any] = []  # the second request's row, once submitted
    late: list[int] = []  # steps started while it waited (it was queued and not in the step)

    def check(rows: list[Any]) -> None:
        if queued and queued[0] in engine.group._queue:
            late.append(1)

    StepLog(engine, check)
    await with_a_second_request(engine, tiny_loaded, prompt_of(6, 1), prompt_of(9, 2), 8, queued.append)
    assert queued and len(late) <= 1


async def test_a_burst_yields_to_a_task_within_one_step(tiny_loaded) -> None:
    engine = Engine(tiny_loaded, decode_burst=64)
    waiting: list[bool] = []  # True while the task is queued and has not run
    late: list[int] = []

    def check(rows: list[Any]) -> None:
        if waiting and waiting[0]:
            late.append(1)

    StepLog(engine, check)
    ran = anyio.Event()

    def task() -> str:
        waiting[0] = False
        return "done"

    async def run_task() -> None:
        waiting.append(True)  # enqueued below in this same turn of the loop
        assert await engine.tasks.run(task, label="whisper-like") == "done"
        ran.set()

    seen = [0]

    def progress() -> None:
        seen[0] += 1
        if seen[0] == 4:
            tg.start_soon(run_task)

    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        await generate(engine, prompt_of(5, 4), 40, progress)
        await ran.wait()
        engine.close()
    assert waiting == [False] and len(late) <= 1


async def test_a_burst_runs_at_most_one_step_ahead_of_a_busy_loop(tiny_loaded) -> None:
    import time

    engine = Engine(tiny_loaded, decode_burst=64)
    log = StepLog(engine)
    ahead: list[int] = []  # steps started when each step's deltas were published
    published = [0]
    land = engine.group._landed

    def slow_landed(done: Any, gap: float | None = None) -> None:
        published[0] += 1
        ahead.append(log.steps - published[0])
        time.sleep(0.01)  # the event loop busy with other work (websocket frames, HTTP parsing)
        land(done, gap)

    engine.group._landed = slow_landed  # type: ignore[method-assign]
    await serve_one(engine, tiny_loaded, prompt_of(6, 5), 30)
    # The step published, the one after it, and the one whose check found the loop behind: never more.
    assert max(ahead) <= 2


@pytest.mark.parametrize("label", ["whisper.step", "prefix-cache put"])
async def test_no_bursts_while_another_subsystem_shares_the_loop(tiny_loaded, label: str) -> None:
    engine = Engine(tiny_loaded, decode_burst=16)
    engine.group.bursts.task_quiet_seconds = 3600.0  # "lately" spans the whole test, however slow the machine
    log = StepLog(engine)
    await serve_one(engine, tiny_loaded, prompt_of(8, 6), 40,
                    before=lambda: engine.tasks.run(lambda: None, label=label))
    if label == "whisper.step":  # live speech on the loop: every step goes back to it
        assert log.handoffs >= log.steps
    else:  # the group's own prefix-cache puts do not count
        assert log.planned_handoffs <= 2 + log.steps // 8


async def test_a_request_waiting_for_a_free_row_does_not_end_bursts(tiny_loaded) -> None:
    engine = Engine(tiny_loaded, max_active=1, decode_burst=16)  # every row busy: the next waits for a finish
    log = StepLog(engine)
    second: dict[str, list[int]] = {}
    at_submit: list[tuple[int, int]] = []  # (steps, hand-offs) when the second request was queued

    async def collect(prompt: list[int]) -> None:
        second["got"] = await generate(engine, prompt, 6)

    def progress() -> None:
        if not at_submit and log.steps >= 4:
            at_submit.append((log.steps, log.planned_handoffs))
            tg.start_soon(collect, prompt_of(5, 8))

    first = prompt_of(6, 7)
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        got = await generate(engine, first, 48, progress)
        steps, handoffs = log.steps - at_submit[0][0], log.planned_handoffs - at_submit[0][1]
        while "got" not in second:
            await anyio.wait_all_tasks_blocked()
        engine.close()
    assert got == reference(tiny_loaded.model, first, 48)
    assert second["got"] == reference(tiny_loaded.model, prompt_of(5, 8), 6)
    # While the first row decoded its last ~44 tokens beside a queued request, it still went in bursts.
    assert steps >= 40 and handoffs <= 2 + steps // 8 and "join" not in log.ends


async def test_a_burst_hands_back_within_one_step_when_a_lane_job_lands(tiny_loaded) -> None:
    # The loop takes a landed job's rows back at once (it idles while a burst runs): each step here waits for that, so
    # the burst must learn of the job from the lane itself. A flag the loop cleared on landing kept the new row out
    # of the whole burst (H200: 140 ms before a stream's second token at 8 streams).
    import threading

    engine = Engine(tiny_loaded, decode_burst=64, prefill_lane=True, memory_budget=1 << 30)
    lane = engine.group.lane
    assert lane is not None
    landed = threading.Event()
    land = lane._land

    def land_and_tell(rows: list[Any], *args: Any) -> None:
        land(rows, *args)
        if second and second[0] in rows:
            landed.set()

    lane._land = land_and_tell  # type: ignore[method-assign]
    second: list[Any] = []
    left_out: list[int] = []  # steps that began while the second row could decode but was not among their rows

    def check(rows: list[Any]) -> None:
        if second and lane.rows and second[0] in lane.rows:
            assert landed.wait(30), "the lane job never landed"
        elif second and second[0].decoding and not second[0].in_lane and second[0] not in rows:
            left_out.append(1)

    StepLog(engine, check)
    await with_a_second_request(engine, tiny_loaded, prompt_of(6, 9), prompt_of(11, 10), 6, second.append)
    assert landed.is_set() and len(left_out) <= 1
