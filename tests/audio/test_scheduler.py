"""audio/scheduler.py: windows in flight share bounded steps — one step queued at a time, encoder and decoder
steps alternating — and decode what they decode alone; a cancelled window leaves before the next step."""

from __future__ import annotations

import anyio
import numpy as np
import pytest

from audio import scheduler as scheduler_module
from audio.scheduler import StepBudget, WhisperScheduler, WindowRequest, WindowResult
from audio.whisper import LoadedWhisper
from engine.context import EngineThread
from engine.tasks import ExecutionTasks
from tests.audio.conftest import running_tasks

pytestmark = pytest.mark.anyio


def request(seconds: float, seed: int, **kw: object) -> WindowRequest:
    audio = np.random.default_rng(seed).normal(0, 0.1, int(seconds * 16000)).astype(np.float32)
    return WindowRequest(audio=audio, frames=int(seconds * 100), language="en", **kw)  # type: ignore[arg-type]


async def decode_all(scheduler: WhisperScheduler, loaded: LoadedWhisper,
                     requests: list[WindowRequest]) -> list[WindowResult]:
    results: list[WindowResult | None] = [None] * len(requests)

    async def one(i: int) -> None:
        results[i] = await scheduler.decode(loaded, requests[i])

    async with anyio.create_task_group() as tg:
        for i in range(len(requests)):
            tg.start_soon(one, i)
    return [r for r in results if r is not None]


async def test_windows_together_decode_what_they_decode_alone(tiny_whisper: LoadedWhisper) -> None:
    requests = [request(s, seed=s, without_timestamps=s % 2 == 0, prompt=(400 + s, 401)) for s in (2, 5, 11, 30)]
    async with running_tasks() as tasks:
        # a budget that encodes all four in two steps, so their rows decode side by side
        scheduler = WhisperScheduler(tasks, StepBudget(encoder_positions=24000))
        alone = [(await decode_all(scheduler, tiny_whisper, [r]))[0] for r in requests]
        steps_alone = scheduler.counters.decoder_steps
        together = await decode_all(scheduler, tiny_whisper, requests)
    for a, b in zip(alone, together):
        assert a.decoded.tokens == b.decoded.tokens and a.decoded.text == b.decoded.text
    assert scheduler.counters.max_rows == 4  # the four windows' rows shared decoder steps
    assert scheduler.counters.decoder_steps - steps_alone < steps_alone


async def test_one_step_is_queued_at_a_time_and_the_kinds_alternate(tiny_whisper: LoadedWhisper) -> None:
    tasks, thread = ExecutionTasks(), EngineThread("test-scheduler")
    scheduler = WhisperScheduler(tasks, StepBudget(encoder_positions=375, decode_tokens=2))
    queued: list[list[str]] = []
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(decode_all, scheduler, tiny_whisper, [request(3, 1), request(4, 2)])
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(decode_all, scheduler, tiny_whisper, [request(6, 3)])
            while True:
                await anyio.wait_all_tasks_blocked()
                queued.append(tasks.labels())
                if not tasks.pending:
                    break
                assert await tasks.advance(thread)
    finally:
        thread.close()
    assert all(q == ["whisper.step"] for q in queued[:-1]) and queued[-1] == []
    kinds = scheduler.counters.kinds
    assert kinds.count("encode") == 3 * 10  # 3 windows × (front + 2 layers × 4 chunks + post), one unit a step
    # whenever both kinds had work they alternated: never two encoder steps while rows were decoding
    decoding = False
    for prev, kind in zip(kinds, kinds[1:]):
        if prev == "encode" and kind == "encode":
            assert not decoding
        decoding = decoding or kind == "decode"
        if kind == "decode":
            decoding = True


async def test_the_encoder_budget_sets_units_per_step(tiny_whisper: LoadedWhisper) -> None:
    async with running_tasks() as tasks:
        small = WhisperScheduler(tasks, StepBudget(encoder_positions=375))
        await decode_all(small, tiny_whisper, [request(3, 1)])
        big = WhisperScheduler(tasks, StepBudget(encoder_positions=12000))
        await decode_all(big, tiny_whisper, [request(3, 1), request(3, 2)])
    assert small.counters.encoder_steps == 10  # front, 2 layers × 4 chunks of 375, post
    assert big.counters.encoder_steps == 1  # 8 units (2 windows × 4 of 1500 positions), one step


async def test_a_cancelled_window_leaves_before_the_next_step(tiny_whisper: LoadedWhisper) -> None:
    tasks, thread = ExecutionTasks(), EngineThread("test-scheduler")
    scheduler = WhisperScheduler(tasks)
    kept: list[WindowResult] = []
    try:
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()

            async def doomed() -> None:
                with scope:
                    await scheduler.decode(tiny_whisper, request(5, 7))

            async def keeper() -> None:
                kept.append(await scheduler.decode(tiny_whisper, request(5, 8)))

            tg.start_soon(doomed)
            tg.start_soon(keeper)
            await anyio.wait_all_tasks_blocked()
            assert await tasks.advance(thread)  # one encoder step: both windows' fronts, stacked
            await anyio.wait_all_tasks_blocked()
            assert scheduler.in_flight == 2
            scope.cancel()
            await anyio.wait_all_tasks_blocked()
            assert scheduler.in_flight == 1  # gone at once; the queued step will not see it
            while tasks.pending:
                assert await tasks.advance(thread)
                await anyio.wait_all_tasks_blocked()
    finally:
        thread.close()
    assert len(kept) == 1 and scheduler.counters.windows == 1 and scheduler.in_flight == 0


async def test_rows_fall_back_one_rung_at_a_time_with_keyed_draws(tiny_whisper: LoadedWhisper) -> None:
    # logprob_threshold 0 fails every attempt: each window climbs the whole ladder on its own
    ladder = dict(temperatures=(0.0, 0.5, 1.0), logprob_threshold=0.0, no_speech_threshold=None,
                  without_timestamps=True)
    async with running_tasks() as tasks:
        scheduler = WhisperScheduler(tasks)
        one = await decode_all(scheduler, tiny_whisper, [request(4, 1, **ladder)])
        two = await decode_all(scheduler, tiny_whisper, [request(4, 1, **ladder), request(7, 2, **ladder)])
    assert one[0].decoded.temperature == two[0].decoded.temperature == 1.0
    assert one[0].decoded.tokens == two[0].decoded.tokens  # sampled, yet the same whoever shared the steps
    assert scheduler.counters.fallbacks == 2 * 3


async def test_a_failing_step_fails_its_windows_and_the_loop_goes_on(tiny_whisper: LoadedWhisper,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    real = scheduler_module.run_unit

    def broken(model: object, jobs: list) -> None:
        if any(len(j.audio) == 16000 for j in jobs):
            raise RuntimeError("boom")
        real(model, jobs)

    monkeypatch.setattr(scheduler_module, "run_unit", broken)
    async with running_tasks() as tasks:
        scheduler = WhisperScheduler(tasks, StepBudget(encoder_positions=375))
        with pytest.raises(RuntimeError, match="boom"):
            await scheduler.decode(tiny_whisper, request(1, 1))
        ok = await scheduler.decode(tiny_whisper, request(2, 2))
    assert ok.decoded.tokens is not None and scheduler.in_flight == 0
