"""audio/scheduler.py: windows in flight share bounded steps — one step queued at a time, encoder and decoder
steps alternating — and decode what they decode alone; a cancelled window leaves before the next step."""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import numpy as np
import pytest

from audio import scheduler as scheduler_module
from audio.scheduler import StepBudget, WhisperScheduler
from audio.window import WindowRequest, WindowResult
from audio.whisper import LoadedWhisper
from engine.context import EngineThread
from engine.tasks import ExecutionTasks
from tests.fixtures.settle import settle
from tests.audio.conftest import running_tasks
from tests.engine.test_blas_threads import fake_blas  # noqa: F401  (a fixture: OpenBLAS's two calls, recorded)

pytestmark = pytest.mark.anyio


def request(seconds: float, seed: int, **kw: object) -> WindowRequest:
    audio = np.random.default_rng(seed).normal(0, 0.1, int(seconds * 16000)).astype(np.float32)
    return WindowRequest(audio=audio, frames=int(seconds * 100), **{"language": "en", **kw})  # type: ignore[arg-type]


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
    scheduler = WhisperScheduler(tasks, StepBudget(encoder_positions=375, decode_tokens=2, min_step_seconds=0.0, even_steps=False))
    queued: list[list[str]] = []
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(decode_all, scheduler, tiny_whisper, [request(3, 1), request(4, 2)])
            await settle()
            tg.start_soon(decode_all, scheduler, tiny_whisper, [request(6, 3)])
            while True:
                await settle()
                queued.append(tasks.labels())
                if not tasks.pending:
                    break
                assert await tasks.advance(thread)
    finally:
        thread.close()
    assert all(q == ["whisper.step"] for q in queued[:-1]) and queued[-1] == []
    kinds = scheduler.counters.kinds
    # 3 windows × (mel, conv1 and conv2 in 4 chunks each, 2 layers × (keys/values + 4 chunks), norm, 2 cross
    # attentions), one unit a step
    assert kinds.count("encode") == 3 * 22
    # whenever both kinds had work they alternated: two encoder steps in a row only while no row decoded
    steps = scheduler.counters.steps
    assert any(b.kind == "decode" and a.kind == "encode" for a, b in zip(steps, steps[1:]))
    for prev, step in zip(steps, steps[1:]):
        if prev.kind == step.kind == "encode":
            assert step.rows == 0


async def test_the_encoder_budget_sets_units_per_step(tiny_whisper: LoadedWhisper) -> None:
    async with running_tasks() as tasks:
        small = WhisperScheduler(tasks, StepBudget(encoder_positions=375, min_step_seconds=0.0, even_steps=False))
        await decode_all(small, tiny_whisper, [request(3, 1)])
        big = WhisperScheduler(tasks, StepBudget(encoder_positions=12000, min_step_seconds=0.0, even_steps=False))
        await decode_all(big, tiny_whisper, [request(3, 1), request(3, 2)])
    assert small.counters.encoder_steps == 22  # mel, 2 convs × 4 chunks of 375, 2 layers × 5, norm, 2 cross
    # 10 units of 1500 positions each, both windows stacked in every unit: 8 window-units a step
    assert big.counters.encoder_steps == 3


async def test_a_minimum_step_time_runs_more_units_and_rows_per_step(tiny_whisper: LoadedWhisper) -> None:
    # On a GPU one unit is far shorter than a trip through the loop: a step goes on until its minimum time.
    requests = [request(3, 1), request(4, 2)]
    async with running_tasks() as tasks:
        plain = WhisperScheduler(tasks, StepBudget(encoder_positions=375, min_step_seconds=0.0, even_steps=False))
        alone = await decode_all(plain, tiny_whisper, requests)
        long = WhisperScheduler(tasks, StepBudget(encoder_positions=375, min_step_seconds=1.0))
        together = await decode_all(long, tiny_whisper, requests)
    for a, b in zip(alone, together):
        assert a.decoded.tokens == b.decoded.tokens and a.decoded.text == b.decoded.text
    assert plain.counters.encoder_steps >= 22 and long.counters.encoder_steps <= 2
    assert long.counters.decoder_steps < plain.counters.decoder_steps
    assert long.stats()["min_step_ms"] == 1000.0 and plain.stats()["min_step_ms"] == 0.0
    recent = plain.stats()["recent_steps"]  # durations by kind; no limit was set, so nothing counts as over it
    assert recent["encode"]["n"] == min(256, plain.counters.encoder_steps) and recent["decode"]["n"] > 0
    assert all(r["over_limit"] == 0 and 0 < r["p50_ms"] <= r["max_ms"] for r in recent.values())
    assert recent["decode"]["rows_max"] == 2  # a file's windows overlap: both rows shared a step
    # seconds by kind since start: every step's, summed (fewer than 256 steps here, so all are still recorded)
    for kind in ("encode", "decode"):
        held = sum(s.seconds for s in long.counters.steps if s.kind == kind)
        assert long.stats()[f"{kind}_s"] == pytest.approx(held, abs=2e-3) and held > 0
    # both windows' rows decode together (not always: on a loaded machine one window's encoding may take a step
    # more, and the other's rows decode alone meanwhile — a CI run beside other work saw rows_p50 1)
    assert long.stats()["recent_steps"]["decode"]["rows_max"] == 2


def test_the_minimum_step_time_defaults_by_device() -> None:
    import mlx.core as mx

    from audio.pacing import GPU_MIN_STEP_SECONDS

    on_gpu = mx.default_device().type == mx.DeviceType.gpu
    assert StepBudget().resolved_min_step() == (GPU_MIN_STEP_SECONDS if on_gpu else 0.0)
    assert StepBudget(min_step_seconds=0.002).resolved_min_step() == 0.002
    with pytest.raises(ValueError):
        StepBudget(min_step_seconds=-1)


def test_even_steps_default_by_device(monkeypatch: pytest.MonkeyPatch) -> None:
    import mlx.core as mx

    monkeypatch.delenv("TANDEM_WHISPER_EVEN", raising=False)
    assert StepBudget().resolved_even() == (mx.default_device().type == mx.DeviceType.gpu)
    assert StepBudget(even_steps=True).resolved_even() and not StepBudget(even_steps=False).resolved_even()
    monkeypatch.setenv("TANDEM_WHISPER_EVEN", "on")
    assert StepBudget().resolved_even()


class SteppedClock:
    """The scheduler's clock, moved only by decoder forwards (`forward_s` each): encoder units take no time."""

    def __init__(self, forward_s: float) -> None:
        self.now, self.forward_s = 0.0, forward_s

    def perf_counter(self) -> float:
        return self.now


@pytest.mark.parametrize("even", [False, True])
async def test_even_steps_give_the_encoder_as_long_as_the_decoder_step_before(
        tiny_whisper: LoadedWhisper, monkeypatch: pytest.MonkeyPatch, even: bool) -> None:
    # Two windows decode while a third, longer one is still encoding: with even steps an encoder step after a
    # decoder step of 20 ms (on this clock) goes on with more units until 20 ms, i.e. here until its window is
    # encoded; without, it stops after its budget's units, as before.
    clock = SteppedClock(0.010)
    monkeypatch.setattr(scheduler_module, "time", clock)
    advance = scheduler_module.advance_rows

    def timed(model: object, rows: list, tokens: int) -> None:  # type: ignore[type-arg]
        clock.now += clock.forward_s * tokens
        advance(model, rows, tokens)

    monkeypatch.setattr(scheduler_module, "advance_rows", timed)
    async with running_tasks() as tasks:
        scheduler = WhisperScheduler(tasks, StepBudget(encoder_positions=375, decode_tokens=2, min_step_seconds=0.0,
                                                       even_steps=even))
        async with anyio.create_task_group() as tg:
            tg.start_soon(decode_all, scheduler, tiny_whisper, [request(2, 1), request(3, 2)])
            while not scheduler.counters.decoder_steps:
                await settle()
            tg.start_soon(decode_all, scheduler, tiny_whisper, [request(30, 3)])
    steps = scheduler.counters.steps
    after_decode = [b.work for a, b in zip(steps, steps[1:]) if a.kind == "decode" and b.kind == "encode"]
    assert after_decode
    if even:  # the whole window's remaining units in one step (positions of its 22 units, minus the first ones)
        assert max(after_decode) > 4 * 375
    else:
        assert max(after_decode) <= 375


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
            await settle()
            assert await tasks.advance(thread)  # one encoder step: both windows' fronts, stacked
            await settle()
            assert scheduler.in_flight == 2
            scope.cancel()
            await settle()
            assert scheduler.in_flight == 1  # gone at once; the queued step will not see it
            while tasks.pending:
                assert await tasks.advance(thread)
                await settle()
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


async def test_a_cut_context_decodes_its_own_features_and_stacks_only_with_its_kind(tiny_whisper: LoadedWhisper) -> None:
    # two tokens: too few to loop (a looping cut window is redone whole, below)
    plain = dict(without_timestamps=True, logprob_threshold=None, compression_ratio_threshold=None, sample_len=2)
    async with running_tasks() as tasks:
        scheduler = WhisperScheduler(tasks, StepBudget(encoder_positions=24000))
        cut, whole, other = await decode_all(scheduler, tiny_whisper, [
            request(3, 1, audio_ctx=500, keep_features=True, **plain), request(3, 1, keep_features=True, **plain),
            request(5, 2, audio_ctx=750, keep_features=True, **plain)])
        again = await decode_all(scheduler, tiny_whisper, [request(3, 1, audio_ctx=500, keep_features=True, **plain)])
    assert cut.features.shape[1] == 500 and other.features.shape[1] == 750 and whole.features.shape[1] == 1500
    assert again[0].decoded.tokens == cut.decoded.tokens  # the same alone as beside windows of other contexts
    assert scheduler.counters.whole_window_redos == 0


async def test_a_cut_context_detects_its_language_from_its_own_features(multilingual_whisper: LoadedWhisper) -> None:
    from audio.decoder import detect_language

    async with running_tasks() as tasks:
        scheduler = WhisperScheduler(tasks)
        (cut,) = await decode_all(scheduler, multilingual_whisper,
                                  [request(3, 1, audio_ctx=500, language=None, keep_features=True, sample_len=2)])
    assert cut.features.shape[1] == 500
    assert cut.language == detect_language(multilingual_whisper.model, cut.features)


async def test_a_cut_context_whose_text_fails_the_thresholds_is_redone_over_the_whole_window(
        tiny_whisper: LoadedWhisper) -> None:
    # logprob_threshold 0 fails every attempt: the cut window is redone whole once, then climbs the ladder
    ladder = dict(temperatures=(0.0, 0.5), logprob_threshold=0.0, no_speech_threshold=None, without_timestamps=True,
                  keep_features=True)
    async with running_tasks() as tasks:
        scheduler = WhisperScheduler(tasks)
        cut = await decode_all(scheduler, tiny_whisper, [request(4, 1, audio_ctx=500, **ladder)])
        redos, fallbacks = scheduler.counters.whole_window_redos, scheduler.counters.fallbacks
        whole = await decode_all(scheduler, tiny_whisper, [request(4, 1, **ladder)])
        guess = await decode_all(scheduler, tiny_whisper, [request(4, 1, audio_ctx=500, redo_whole=False, **ladder)])
    assert redos == 1 and fallbacks == 1 and scheduler.counters.whole_window_redos == 1
    assert cut[0].features.shape[1] == 1500 and cut[0].decoded.temperature == 0.5
    assert cut[0].decoded.tokens == whole[0].decoded.tokens  # what the whole window decodes, rung for rung
    assert guess[0].features.shape[1] == 500  # a guess is not redone: it climbs the ladder over its cut context


async def test_a_cut_final_whose_text_loops_is_redone_whole_though_it_passes_the_thresholds(
        tiny_whisper: LoadedWhisper) -> None:
    from audio.window import loops

    plain = dict(without_timestamps=True, logprob_threshold=None, compression_ratio_threshold=None,
                 keep_features=True, sample_len=16)
    async with running_tasks() as tasks:
        scheduler = WhisperScheduler(tasks)
        (guess,) = await decode_all(scheduler, tiny_whisper, [request(3, 1, audio_ctx=500, redo_whole=False, **plain)])
        (final,) = await decode_all(scheduler, tiny_whisper, [request(3, 1, audio_ctx=500, **plain)])
        (whole,) = await decode_all(scheduler, tiny_whisper, [request(3, 1, **plain)])
    eot = 50256
    assert loops([t for t in guess.decoded.sampled if t < eot])  # the random model loops over the cut context
    assert scheduler.counters.whole_window_redos == 1 and final.features.shape[1] == 1500
    assert final.decoded.tokens == whole.decoded.tokens


async def test_a_failing_step_fails_its_windows_and_the_loop_goes_on(tiny_whisper: LoadedWhisper,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    real = scheduler_module.run_unit

    def broken(model: object, jobs: list, positions: int | None = None) -> None:
        if any(len(j.audio) == 16000 for j in jobs):
            raise RuntimeError("boom")
        real(model, jobs, positions)

    monkeypatch.setattr(scheduler_module, "run_unit", broken)
    async with running_tasks() as tasks:
        scheduler = WhisperScheduler(tasks, StepBudget(encoder_positions=375))
        with pytest.raises(RuntimeError, match="boom"):
            await scheduler.decode(tiny_whisper, request(1, 1))
        ok = await scheduler.decode(tiny_whisper, request(2, 2))
    assert ok.decoded.tokens is not None and scheduler.in_flight == 0


async def test_while_chat_decodes_each_step_does_what_its_share_allows(tiny_whisper: LoadedWhisper) -> None:
    # a chat iteration so short that no unit fits its share: every step does the least that moves speech
    async with running_tasks() as tasks:
        paced = WhisperScheduler(tasks, StepBudget(encoder_positions=375, min_step_seconds=0.0, even_steps=False), pace=lambda: 1e-9)
        results = await decode_all(paced, tiny_whisper, [request(3, 1, prompt=tuple(range(400, 430))), request(4, 2)])
        full = WhisperScheduler(tasks, StepBudget(encoder_positions=375, min_step_seconds=0.0, even_steps=False), pace=lambda: None)
        await decode_all(full, tiny_whisper, [request(3, 1, prompt=tuple(range(400, 430))), request(4, 2)])
    c = paced.counters
    assert len(results) == 2 and c.paced_steps == c.encoder_steps + c.decoder_steps
    encoder = [s.work for s in paced.counters.steps if s.kind == "encode"]
    decoder = [s.work for s in paced.counters.steps if s.kind == "decode"]
    # one window's unit a step: 64 positions of a conv or layer (28 at a stage's end), or one fixed unit
    assert set(encoder) <= {1, 28, 64} and 64 in encoder
    assert max(decoder) <= 8 + 3  # one row a forward; a prompt fed 8 tokens at a time
    assert all(s.limit is None for s in full.counters.steps) and full.counters.paced_steps == 0
    # with the full budget, conv and layer units cover 375 positions
    assert 375 in {s.work for s in full.counters.steps if s.kind == "encode"}
    assert full.counters.encoder_steps + full.counters.decoder_steps < c.encoder_steps + c.decoder_steps


async def test_a_step_queued_while_chat_was_idle_is_paced_once_chat_has_begun(tiny_whisper: LoadedWhisper) -> None:
    # The step's limit is read when it starts: chat that arrived while the step waited in the queue is protected.
    chat: list[float | None] = [None]
    tasks, thread = ExecutionTasks(), EngineThread("test-scheduler")
    scheduler = WhisperScheduler(tasks, StepBudget(encoder_positions=375), pace=lambda: chat[0])
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(decode_all, scheduler, tiny_whisper, [request(3, 1)])
            await settle()
            assert tasks.labels() == ["whisper.step"]  # queued while chat had no row
            chat[0] = 1e-9  # a chat row arrives before the step runs
            assert await tasks.advance(thread)
            first = scheduler.counters.steps[0]
            chat[0] = None
            while True:
                await settle()
                if not tasks.pending:
                    break
                assert await tasks.advance(thread)
    finally:
        thread.close()
    assert first.limit is not None and scheduler.counters.paced_steps >= 1
    assert scheduler.counters.steps[-1].limit is None


def test_the_step_limit_grows_with_the_oldest_live_windows_wait() -> None:
    # Live speech that falls behind chat catches up: the share doubles per second the oldest live session's
    # window waited; a file's windows and finished ones do not count.
    import time
    from types import SimpleNamespace

    scheduler = WhisperScheduler(ExecutionTasks(), StepBudget(chat_share=0.3, catch_up_seconds=1.0), pace=lambda: 0.01)
    now = time.perf_counter()
    live, file = SimpleNamespace(realtime=True), SimpleNamespace(realtime=False)
    scheduler._windows = [SimpleNamespace(live=True, since=now, request=live),  # type: ignore[list-item]
                          SimpleNamespace(live=True, since=now - 30.0, request=file)]  # a file's: no deadline
    scheduler._plan()
    assert scheduler.clock.limit == pytest.approx(0.003, rel=0.05)
    scheduler._windows += [SimpleNamespace(live=True, since=now - 2.0, request=live),  # type: ignore[list-item]
                           SimpleNamespace(live=False, since=now - 60.0, request=live)]  # finished: no longer waits
    scheduler._plan()
    assert scheduler.clock.limit == pytest.approx(0.012, rel=0.05)


async def test_steps_on_a_thread_of_their_own_decode_what_tasks_decode(tiny_whisper: LoadedWhisper) -> None:
    requests = [request(s, seed=s, without_timestamps=s % 2 == 0) for s in (3, 9, 20)]
    async with running_tasks() as tasks:
        queued = WhisperScheduler(tasks, StepBudget(encoder_positions=24000))
        want = await decode_all(queued, tiny_whisper, requests)
        own = WhisperScheduler(tasks, StepBudget(encoder_positions=24000))
        own.thread = EngineThread("test-speech")
        before = tasks.completed
        try:
            got = await decode_all(own, tiny_whisper, requests)
        finally:
            own.thread.close()
        assert tasks.completed == before  # no step went through the engine's task queue
    assert [r.decoded.tokens for r in got] == [r.decoded.tokens for r in want]
    assert own.counters.encoder_steps > 0 and own.counters.decoder_steps > 0


async def test_steps_run_on_the_alone_thread_while_chat_has_no_row_and_decode_the_same(tiny_whisper: LoadedWhisper,
                                                                                       monkeypatch) -> None:
    # A CPU's speech thread is niced (it yields to chat, but to every other program too): while chat has no row the
    # steps run on a thread at the process's priority. Windows move between the two threads from step to step.
    import threading

    ladder = dict(temperatures=(0.0, 0.5, 1.0), logprob_threshold=0.0, no_speech_threshold=None)
    requests = [request(s, seed=s, without_timestamps=s % 2 == 0) for s in (3, 9, 20)] + [
        request(5, 7, prompt=(400, 401), **ladder),  # timestamps, a prompt and every rung of the fallback ladder
        request(4, 1, audio_ctx=500, without_timestamps=True, keep_features=True, **ladder)]  # cut, redone whole
    chat = {"running": False}
    async with running_tasks() as tasks:
        want = await decode_all(WhisperScheduler(tasks, StepBudget(encoder_positions=24000)), tiny_whisper, requests)
        scheduler = WhisperScheduler(tasks, StepBudget(encoder_positions=24000),
                                     pace=lambda: 0.5 if chat["running"] else None)
        scheduler.thread, scheduler.alone_thread = EngineThread("test-beside-chat"), EngineThread("test-alone")
        ran: list[tuple[str, bool]] = []
        step = scheduler._step

        def recorded() -> str:
            ran.append((threading.current_thread().name, chat["running"]))
            chat["running"] = not chat["running"]  # chat comes and goes between steps
            return step()

        monkeypatch.setattr(scheduler, "_step", recorded)
        try:
            got = await decode_all(scheduler, tiny_whisper, requests)
        finally:
            scheduler.thread.close()
            scheduler.alone_thread.close()
    assert [r.decoded.tokens for r in got] == [r.decoded.tokens for r in want]
    assert {name for name, _ in ran} == {"test-beside-chat", "test-alone"}
    assert all(name == ("test-beside-chat" if running else "test-alone") for name, running in ran), ran
    assert scheduler.counters.handoffs >= len(ran) // 2  # windows in flight settled on the thread that built them
    for running in (True, False):  # what live sessions read to shape their guesses (audio/live_config.py)
        chat["running"] = running
        assert scheduler.chat_active() is running


async def test_speech_alone_on_its_own_thread_gives_a_core_back_once_another_process_is_busy(
        tiny_whisper: LoadedWhisper, fake_blas, monkeypatch) -> None:
    # No chat row, so no chat iteration samples the machine: the scheduler must, or two BLAS threads wait on each
    # other beside the busy process (a live speaker's first words came 7.7 s after onset instead of 1 s).
    from engine import blas_threads

    others = itertools.count(0.0, 1e6)  # each reading finds the rest of the machine a million seconds busier
    load = blas_threads.OtherLoad(interval=0.0, machine=lambda: next(others), own=lambda: 0.0)
    load.quiet = True  # quiet until speech began
    monkeypatch.setattr(blas_threads, "others", load)
    seen: list[int] = []
    async with running_tasks() as tasks:
        scheduler = WhisperScheduler(tasks, StepBudget(encoder_positions=375, decode_tokens=2, min_step_seconds=0.0,
                                                       even_steps=False))
        scheduler.thread = EngineThread("test-speech")
        step = scheduler._step

        def recorded() -> str:
            seen.append(fake_blas.threads)
            return step()

        monkeypatch.setattr(scheduler, "_step", recorded)
        try:
            await scheduler.decode(tiny_whisper, request(3, 1))
        finally:
            scheduler.thread.close()
    assert seen[0] == 2 and seen[-1] == 1, seen  # every core on a quiet machine, one once another process was busy


def _held_on_its_thread(tasks: Any, monkeypatch: Any) -> tuple[WhisperScheduler, Any, Any]:
    """A scheduler on its own speech thread whose steps wait there until `release` is set: (scheduler, entered,
    release). Raises nothing."""
    import threading

    scheduler = WhisperScheduler(tasks, StepBudget(encoder_positions=24000))
    scheduler.thread = EngineThread("test-speech")
    entered, release = threading.Event(), threading.Event()
    step = scheduler._step

    def held() -> str:
        entered.set()
        assert release.wait(30), "never released"
        return step()

    monkeypatch.setattr(scheduler, "_step", held)
    return scheduler, entered, release


async def test_a_step_held_on_its_own_thread_holds_no_engine_task(tiny_whisper: LoadedWhisper, monkeypatch) -> None:
    # What chat steps need (the engine's loop and its lease) stays free while a Whisper step runs on its thread.
    async with running_tasks() as tasks:
        scheduler, entered, release = _held_on_its_thread(tasks, monkeypatch)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(decode_all, scheduler, tiny_whisper, [request(4, seed=1)])
                assert await anyio.to_thread.run_sync(entered.wait, 30)
                assert await tasks.run(lambda: "chat's turn") == "chat's turn"  # ran while the step was held
                assert not release.is_set()
                release.set()
        finally:
            release.set()
            scheduler.thread.close()
    assert scheduler.counters.encoder_steps > 0


async def test_a_window_cancelled_during_a_step_on_its_own_thread_leaves(tiny_whisper: LoadedWhisper, monkeypatch) -> None:
    # A live probe is dropped by cancelling its scope while its step runs on the speech thread (whose wait is
    # shielded). The window must leave at once: it spun, leading empty steps, on the CPU with 4 live speakers.
    import threading

    async with running_tasks() as tasks:
        scheduler = WhisperScheduler(tasks, StepBudget(encoder_positions=24000))
        scheduler.thread = EngineThread("test-speech")
        entered, release = threading.Event(), threading.Event()
        steps_after_cancel = 0
        step = scheduler._step

        def held() -> str:
            nonlocal steps_after_cancel
            if release.is_set():
                steps_after_cancel += 1
                if steps_after_cancel > 20:
                    raise RuntimeError("a cancelled window kept leading steps")
            entered.set()
            assert release.wait(30), "never released"
            return step()

        monkeypatch.setattr(scheduler, "_step", held)
        scope = anyio.CancelScope()
        outcome: list[str] = []

        async def doomed() -> None:
            with scope:
                await scheduler.decode(tiny_whisper, request(4, seed=3))
                outcome.append("finished")
            outcome.append("left" if scope.cancelled_caught else "not cancelled")

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(doomed)
                assert await anyio.to_thread.run_sync(entered.wait, 30)
                scope.cancel()  # while its step is held on the speech thread
                release.set()
        finally:
            release.set()
            scheduler.thread.close()
    assert outcome == ["left"] and scheduler.in_flight == 0
    assert steps_after_cancel == 0  # no step led after the one it was cancelled in


async def test_stop_ends_every_window_in_flight_and_refuses_later_ones(tiny_whisper: LoadedWhisper,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # At shutdown a file's windows on the speech thread ran on past the timeout until the worker was killed.
    from audio.errors import SpeechStopped

    async with running_tasks() as tasks:
        scheduler, entered, release = _held_on_its_thread(tasks, monkeypatch)
        outcomes: list[str] = []

        async def one(seed: int) -> None:
            try:
                await scheduler.decode(tiny_whisper, request(30, seed=seed))
                outcomes.append("finished")
            except SpeechStopped as exc:
                outcomes.append(exc.code)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(one, 1)
                tg.start_soon(one, 2)
                assert await anyio.to_thread.run_sync(entered.wait, 30)
                scheduler.stop("shutting down")  # while a step is held on the speech thread
                release.set()
        finally:
            release.set()
            scheduler.thread.close()
        with pytest.raises(SpeechStopped):
            await scheduler.decode(tiny_whisper, request(1, seed=3))
    assert outcomes == ["shutting_down", "shutting_down"] and scheduler.in_flight == 0
    assert scheduler.counters.kinds == ["idle"]  # the held step found its windows ended; none led after it


async def test_with_turns_each_step_on_its_own_thread_waits_for_chats_next_step(tiny_whisper: LoadedWhisper) -> None:
    # On a CPU chat and Whisper share the cores: one Whisper step per chat step, not steps back to back beside them.
    turns = 0
    granted = anyio.Event()
    asked = anyio.Event()

    async def turn() -> None:
        nonlocal turns, granted
        asked.set()
        await granted.wait()
        granted = anyio.Event()
        turns += 1

    async with running_tasks() as tasks:
        own = WhisperScheduler(tasks, StepBudget(encoder_positions=24000))
        own.thread, own.turn = EngineThread("test-speech"), turn
        try:
            with anyio.fail_after(60):  # without turns nothing asks: this would wait for ever
                async with anyio.create_task_group() as tg:
                    tg.start_soon(own.decode, tiny_whisper, request(3, seed=1))
                    for n in range(3):
                        await asked.wait()
                        asked = anyio.Event()
                        steps = own.counters.encoder_steps + own.counters.decoder_steps
                        assert steps == n  # nothing ran while its turn was not given
                        granted.set()
                    tg.cancel_scope.cancel()
        finally:
            own.thread.close()
    assert turns == 3


async def test_each_window_is_logged_at_debug_level(tiny_whisper: LoadedWhisper, caplog) -> None:
    # `tandem serve --log-level debug` traces every decode (live guesses and finals, file windows): how the slow
    # first words of live speech were found.
    import logging

    async with running_tasks() as tasks:
        scheduler = WhisperScheduler(tasks, StepBudget(encoder_positions=24000))
        with caplog.at_level(logging.DEBUG, logger="audio.scheduler"):
            result, = await decode_all(scheduler, tiny_whisper, [request(2, seed=1, prompt=(400, 401))])
    lines = [r.getMessage() for r in caplog.records if r.name == "audio.scheduler"]
    assert len(lines) == 1 and lines[0].startswith("window: 2.00 s of audio, 1 temperature(s), prompt 2 + prefix 0")
    assert lines[0].endswith(repr(result.decoded.text))


async def test_one_unit_steps_encode_the_oldest_window_first(tiny_whisper: LoadedWhisper,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # A CPU's budget runs one window-unit a step: a live window that came later waits for the older one's encoder
    # instead of taking every other step (which shared the encoder among every window in flight).
    ran: list[set[int]] = []
    real = scheduler_module.run_unit

    def logged(model: object, jobs: list, positions: int | None = None) -> None:  # type: ignore[type-arg]
        ran.append({len(j.audio) for j in jobs})
        real(model, jobs, positions)

    monkeypatch.setattr(scheduler_module, "run_unit", logged)
    first, later = request(3, 1, realtime=True), request(4, 2, realtime=True)
    tasks, thread = ExecutionTasks(), EngineThread("test-scheduler")
    scheduler = WhisperScheduler(tasks, StepBudget(encoder_positions=375, min_step_seconds=0.0, even_steps=False))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(decode_all, scheduler, tiny_whisper, [first])
            await settle()
            assert await tasks.advance(thread)  # the first window's first unit
            tg.start_soon(decode_all, scheduler, tiny_whisper, [later])
            await settle()
            assert scheduler.in_flight == 2
            while tasks.pending:
                assert await tasks.advance(thread)
                await settle()
    finally:
        thread.close()
    a, b = len(first.audio), len(later.audio)
    assert len([u for u in ran if a in u]) == 22 and len([u for u in ran if b in u]) == 22
    assert max(i for i, u in enumerate(ran) if a in u) < min(i for i, u in enumerate(ran) if b in u)
