"""audio/sessions.py: live sessions on the real loop with a tiny random-init Whisper — only speech is decoded,
caps refuse without losing audio, lag is reported, cancelling drops queued work, and four sessions at once
transcribe as four one after another."""

from __future__ import annotations

from pathlib import Path

import anyio
import numpy as np
import pytest

from audio.buffers import AudioLimitExceeded
from audio.live import LiveConfig
from audio.errors import AudioInputError, SessionClosed
from audio.pcm import PcmFormat
from audio.scheduler import WhisperScheduler
from audio.window import WindowRequest
from audio.sessions import LiveSession
from audio.transcript import TranscribeOptions
from audio.whisper import WhisperResidency
from engine.context import EngineThread
from engine.tasks import ExecutionTasks
from tests.audio.conftest import SR, running_tasks, voiced
from tests.fixtures.settle import settle
from tests.fixtures.g711 import encode_g711

pytestmark = pytest.mark.anyio
FAST = TranscribeOptions(temperatures=(0.0,))
F32 = PcmFormat()


def f32(x: np.ndarray) -> bytes:
    return x.astype("<f4").tobytes()


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SR), np.float32)


def session(tasks: ExecutionTasks, whisper_dir: Path, options: TranscribeOptions = FAST,
            scheduler: WhisperScheduler | None = None, **config: float) -> LiveSession:
    residency = WhisperResidency(whisper_dir, tasks, dtype="float32", resident=True)
    scheduler = scheduler if scheduler is not None else WhisperScheduler(tasks)
    return LiveSession(options, residency, scheduler, tasks, config=LiveConfig(**config))


async def test_silence_never_reaches_whisper(tiny_whisper_dir: Path) -> None:
    async with running_tasks() as tasks:
        s = session(tasks, tiny_whisper_dir)
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.pump)
            faint = np.random.default_rng(0).normal(0, 0.003, 65 * SR).astype(np.float32)
            s.append(f32(silence(31)), F32)
            s.append(f32(faint), F32)
            await s.caught_up()
            assert s.lag_seconds < 0.5 and tasks.completed == 0  # no load, no window
            t = await s.finish()
    assert t.text == "" and t.segments == [] and t.duration == pytest.approx(96.0)
    assert [e.type for e in s.events_log] == []


async def test_only_speech_is_decoded_and_speech_events_mark_it(tiny_whisper_dir: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[int] = []
    real = WhisperScheduler.decode

    async def spy(self: WhisperScheduler, loaded: object, request: WindowRequest, scope: object = None) -> object:
        assert request.realtime  # a live session's windows catch up when chat holds them back
        decoded.append(len(request.audio))
        return await real(self, loaded, request, scope)  # type: ignore[arg-type]

    monkeypatch.setattr(WhisperScheduler, "decode", spy)
    async with running_tasks() as tasks:
        s = session(tasks, tiny_whisper_dir, redecode_s=100.0, first_redecode_s=None)
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.pump)
            s.append(f32(np.concatenate([silence(10), voiced(2), silence(10), voiced(1), silence(3)])), F32)
            t = await s.finish()
    assert decoded and max(decoded) <= (3 + 4 * 0.2 + 0.3) * SR  # the speech and its padding, no silence
    marks = [(e.type, e.audio_ms) for e in s.events_log if e.type.startswith("speech")]
    assert [m[0] for m in marks] == ["speech_started", "speech_stopped"] * 2
    assert 9700 <= marks[0][1] <= 10000 and 12000 <= marks[1][1] <= 12500 and 21700 <= marks[2][1] <= 22000
    assert all(0 <= seg.start <= seg.end <= 26.0 for seg in t.segments)


async def test_caps_refuse_a_chunk_and_keep_the_audio(tiny_whisper_dir: Path) -> None:
    async with running_tasks() as tasks:
        s = session(tasks, tiny_whisper_dir, max_session_s=2.0)
        s.append(f32(voiced(1.5)), F32)
        with pytest.raises(AudioLimitExceeded) as err:
            s.append(f32(voiced(1.0)), F32)
        assert isinstance(err.value, AudioInputError) and err.value.code == "session_audio_limit"
        s16 = (voiced(1.0) * 32767).astype("<i2").tobytes()  # the cap counts seconds, whatever the encoding
        with pytest.raises(AudioLimitExceeded):
            s.append(s16, PcmFormat(8000, "s16le"))
        ulaw = encode_g711(voiced(0.5), "ulaw")  # 8,000 codes, one byte each: 1 s at 8 kHz, not 0.5
        with pytest.raises(AudioLimitExceeded):
            s.append(ulaw, PcmFormat(8000, "ulaw"))
        s.append(f32(voiced(0.5)), F32)
        assert s.received_seconds == pytest.approx(2.0)
        for bad, fmt in ((b"\x00" * 7, F32), (f32(np.array([np.nan] * 4)), F32)):
            with pytest.raises(AudioInputError):
                s.append(bad, fmt)
        assert s.received_seconds == pytest.approx(2.0)
        s.cancel()


async def test_the_utterance_open_at_the_audio_cap_ends_there_and_is_transcribed(tiny_whisper_dir: Path) -> None:
    # A speaker still talking when the session reached --max-session-seconds: every later chunk refused, the
    # utterance never ended (no speech_stopped, no text) and its words were lost.
    async with running_tasks() as tasks:
        s = session(tasks, tiny_whisper_dir, max_session_s=3.0, redecode_s=100.0, first_redecode_s=None)
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.pump)
            s.append(f32(np.concatenate([silence(0.5), voiced(2.5)])), F32)
            await s.caught_up()
            assert [e.type for e in s.events_log] == ["speech_started"]  # VAD waits for the pause
            for _ in range(2):  # refused: the utterance ends at the cap, once
                with pytest.raises(AudioLimitExceeded):
                    s.append(f32(voiced(0.1)), F32)
            await s.caught_up()
            kinds = [(e.type, e.item) for e in s.events_log if e.type not in ("committed", "tentative")]
            assert kinds == [("speech_started", 0), ("speech_stopped", 0), ("audio_committed", 0), ("utterance", 0)]
            stopped = next(e for e in s.events_log if e.type == "speech_stopped")
            assert stopped.audio_ms == 3000 and not s.closed and s.received_seconds == pytest.approx(3.0)
            s.cancel()


async def test_decoded_audio_after_raw_chunks_comes_after_their_resampler_tail(tiny_whisper_dir: Path) -> None:
    async with running_tasks() as tasks:
        s = session(tasks, tiny_whisper_dir)
        rate48 = np.arange(int(0.5 * 48000)) / 48000
        s.append((0.3 * np.sin(2 * np.pi * 220 * rate48) * 32767).astype("<i2").tobytes(), PcmFormat(48000, "s16le"))
        marker = np.full(1600, 0.5, np.float32)  # a WAV chunk, decoded: sent after the raw audio
        s.append_samples(marker)
        s.commit()  # flushes whatever the resampler still holds
        assert s.received_seconds == pytest.approx(0.6, abs=0.002)
        received = s._raw.view(0, s._raw.total)  # the session's audio in arrival order (no public reader)
        np.testing.assert_array_equal(received[-1600:], marker)
        s.cancel()


async def test_noise_reduction_filters_the_audio_taken_from_where_it_is_asked_for(tiny_whisper_dir: Path) -> None:
    """The high-pass runs on the audio as it is taken (before the gate and Whisper), its state carried across
    chunks and kinds of input; an update changes it for the audio appended after it."""
    from audio.noise_reduction import HighPass

    t = np.arange(2 * SR) / SR
    hummed = (0.3 * np.sin(2 * np.pi * 50 * t) + voiced(2)).astype(np.float32)
    async with running_tasks() as tasks:
        s = session(tasks, tiny_whisper_dir, TranscribeOptions(temperatures=(0.0,), noise_reduction="near_field"))
        s.append(f32(hummed[:SR]), F32)
        s.append_samples(hummed[SR:])
        s.reconfigure(TranscribeOptions(temperatures=(0.0,), noise_reduction=None, logprobs=True))
        assert s.live.logprobs  # the decodes from here keep token log probabilities
        s.append(f32(hummed), F32)
        received = s._raw.view(0, s._raw.total)  # the session's audio in arrival order (no public reader)
        s.cancel()
    np.testing.assert_allclose(received[:2 * SR], HighPass("near_field")(hummed), atol=1e-6)
    np.testing.assert_array_equal(received[2 * SR:], hummed)  # turned off: taken as sent


async def test_a_session_behind_reports_its_lag_and_keeps_its_audio(tiny_whisper_dir: Path) -> None:
    tasks, thread = ExecutionTasks(), EngineThread("test-sessions")
    s = session(tasks, tiny_whisper_dir, redecode_s=1.0)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.pump)
            for _ in range(8):  # 8 s arrive while the loop runs nothing
                s.append(f32(voiced(1.0)), F32)
                await settle()
            assert s.lag_seconds >= 7.0 and s.received_seconds == 8.0
            assert s.held_samples >= 7 * SR  # nothing dropped
            while tasks.pending:  # the loop catches up
                assert await tasks.advance(thread)
                await settle()
            assert s.lag_seconds < 1.0 and s.windows_done >= 2
            s.cancel()
    finally:
        thread.close()


async def test_cancel_drops_queued_work_before_the_next_step(tiny_whisper_dir: Path) -> None:
    tasks, thread = ExecutionTasks(), EngineThread("test-sessions")
    scheduler = WhisperScheduler(tasks)
    s = session(tasks, tiny_whisper_dir, scheduler=scheduler)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.pump)
            s.append(f32(voiced(3)), F32)
            await settle()
            assert tasks.labels() == ["whisper.load"]
            await tasks.advance(thread)
            await settle()
            assert tasks.labels() == ["whisper.step"] and scheduler.in_flight == 1
            s.cancel()
            assert scheduler.in_flight == 0  # at once: the queued step will find nothing of it
            steps = scheduler.counters.encoder_steps + scheduler.counters.decoder_steps
            while tasks.pending:
                await tasks.advance(thread)
            assert scheduler.counters.encoder_steps + scheduler.counters.decoder_steps == steps
            with pytest.raises(SessionClosed):
                s.append(f32(voiced(1)), F32)
            with pytest.raises(SessionClosed):
                await s.finish()
    finally:
        thread.close()


async def test_finish_without_audio_loads_nothing(tiny_whisper_dir: Path) -> None:
    tasks = ExecutionTasks()
    s = session(tasks, tiny_whisper_dir)
    async with anyio.create_task_group() as tg:
        tg.start_soon(s.pump)
        t = await s.finish()
    assert t.text == "" and t.duration == 0 and tasks.labels() == []


async def feed(sessions: list[LiveSession], signals: list[np.ndarray], step: float) -> list[str]:
    """Append `step` s to every session, wait until all caught up, repeat; then finish them all."""
    n = int(step * SR)
    for i in range(0, max(len(x) for x in signals), n):
        for s, x in zip(sessions, signals):
            if i < len(x):
                s.append(f32(x[i:i + n]), F32)
        for s in sessions:
            await s.caught_up()
    return [(await s.finish()).text for s in sessions]


async def test_four_sessions_at_once_transcribe_as_four_one_after_another(tiny_whisper_dir: Path) -> None:
    signals = [np.concatenate([voiced(1.5 + k * 0.5, f0=120 + 30 * k), silence(1.0), voiced(1.0, f0=200)])
               for k in range(4)]
    async with running_tasks() as tasks:
        scheduler = WhisperScheduler(tasks)
        alone = []
        async with anyio.create_task_group() as tg:
            for x in signals:
                s = session(tasks, tiny_whisper_dir, scheduler=scheduler)
                tg.start_soon(s.pump)
                alone += await feed([s], [x], 1.0)
            sessions = [session(tasks, tiny_whisper_dir, scheduler=scheduler) for _ in signals]
            for s in sessions:
                tg.start_soon(s.pump)
            together = await feed(sessions, signals, 1.0)
    assert together == alone and any(alone)
    assert scheduler.counters.max_rows >= 2, scheduler.counters  # their rows did share decoder steps
    for s in sessions:
        committed = [e.text for e in s.events_log if e.type == "committed"]
        assert "".join(committed) == s.committed_text()


NO_VAD = TranscribeOptions(temperatures=(0.0,), vad=False)


def items(s: LiveSession, kind: str) -> list[int]:
    return [e.item for e in s.events_log if e.type == kind]


async def test_a_commit_closes_the_utterance_where_it_was_called(tiny_whisper_dir: Path) -> None:
    decoded: list[int] = []
    async with running_tasks() as tasks:
        s = session(tasks, tiny_whisper_dir, NO_VAD, redecode_s=100.0, first_redecode_s=None)
        real = s.live._scheduler.decode

        async def spy(loaded: object, request: WindowRequest, scope: object = None) -> object:
            decoded.append(len(request.audio))
            return await real(loaded, request, scope)  # type: ignore[arg-type]

        s.live._scheduler.decode = spy  # type: ignore[method-assign]
        s.append(f32(voiced(1.0)), F32)
        s.commit()
        with pytest.raises(AudioInputError) as err:
            s.commit()  # a second commit right away has nothing to close
        assert err.value.code == "input_audio_buffer_commit_empty"
        s.append(f32(voiced(0.5)), F32)  # arrives before the pump ran: it belongs to the next utterance
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.pump)
            await s.caught_up()
            await s.finish()
    assert decoded[0] == SR  # the first utterance was decoded alone, cut where commit() was called
    assert items(s, "audio_committed") == [0, 1] and items(s, "utterance") == [0, 1]
    order = [(e.type, e.item) for e in s.events_log if e.type in ("audio_committed", "utterance")]
    assert order.index(("audio_committed", 0)) < order.index(("utterance", 0))


async def test_no_decode_crosses_a_client_commit_even_behind(tiny_whisper_dir: Path) -> None:
    # three committed utterances arrive before the pump runs, as for a session behind: each is decoded alone, over
    # its own audio (merged, Whisper wrote one segment across a commit and one item completed as '')
    decoded: list[int] = []
    async with running_tasks() as tasks:
        s = session(tasks, tiny_whisper_dir, NO_VAD, redecode_s=100.0, first_redecode_s=None, tokens_per_second=1.0)
        real = s.live._scheduler.decode

        async def spy(loaded: object, request: WindowRequest, scope: object = None) -> object:
            decoded.append(len(request.audio))
            return await real(loaded, request, scope)  # type: ignore[arg-type]

        s.live._scheduler.decode = spy  # type: ignore[method-assign]
        for _ in range(3):
            s.append(f32(voiced(1.0)), F32)
            s.commit()
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.pump)
            await s.finish()
    assert decoded == [SR, SR, SR]  # not one decode of 3 s, nor 2 s and 3 s with the earlier audio as context
    assert items(s, "audio_committed") == [0, 1, 2] and items(s, "utterance") == [0, 1, 2]


async def test_clear_drops_the_open_audio_without_committed_text(tiny_whisper_dir: Path) -> None:
    async with running_tasks() as tasks:
        s = session(tasks, tiny_whisper_dir, NO_VAD, redecode_s=100.0, first_redecode_s=None)  # no probes: nothing is committed early
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.pump)
            s.append(f32(voiced(2.0)), F32)
            s.clear()
            s.append(f32(voiced(1.0)), F32)
            t = await s.finish()
    assert s.live.timeline.length == SR  # Whisper saw the second second only
    assert t.duration == pytest.approx(3.0) and s.received_seconds == pytest.approx(3.0)
    assert items(s, "cleared") == [0] and items(s, "audio_committed") == [0] and items(s, "utterance") == [0]
    assert s.live.timeline.to_source(0) == 2 * SR  # times still count the dropped audio


async def test_clear_keeps_committed_text_and_closes_its_utterance(tiny_whisper: object) -> None:
    from tests.audio.test_live import live_text, run_due, speech

    live, scheduler, events = await live_text(tiny_whisper, [[1000, 1002], [1000, 1002, 1004]])  # type: ignore[arg-type]
    live.add_speech(speech(1.5), 0)
    await run_due(live)
    live.add_speech(speech(1.0), int(1.5 * SR))
    await run_due(live)  # two decodes agreed: text committed in the open utterance
    committed = live.committed_text()
    assert committed and live.utterances.open_text
    live.clear()
    assert live.committed_text() == committed and live.tentative == "" and not live.has_open
    assert [(e.type, e.item, e.text) for e in events if e.type == "utterance"] == [("utterance", 0, committed)]
    assert live.next_action(True) is None  # nothing left to decode: the rest of its audio is skipped


async def test_a_session_sending_faster_than_it_is_transcribed_is_refused_and_keeps_its_audio(
        tiny_whisper_dir: Path) -> None:
    tasks = ExecutionTasks()  # nothing runs: the backlog only grows
    s = session(tasks, tiny_whisper_dir, max_lag_s=3.0)
    s.append(f32(voiced(2.5)), F32)
    with pytest.raises(AudioLimitExceeded) as err:
        s.append(f32(voiced(1.0)), F32)
    assert err.value.code == "session_backlog_full" and err.value.retry_after
    assert s.received_seconds == pytest.approx(2.5)
    with pytest.raises(AudioLimitExceeded) as err:  # alone longer than the backlog: a retry never fits (was a 429)
        s.append(f32(voiced(3.5)), F32)
    assert err.value.code == "chunk_too_long" and not err.value.retry_after
    assert s.received_seconds == pytest.approx(2.5)
    s.cancel()


async def test_a_chunk_refused_for_the_backlog_makes_a_guess_due_so_its_retry_is_taken(
        tiny_whisper_dir: Path) -> None:
    # `tandem serve --max-session-lag 6` on a loaded 2-core host: after a slow decode the next guess waited for 5 s
    # of new speech, the backlog refused the speech that would have made it due, and every chunk got a 429 until
    # the session expired.
    from tests.audio.test_live import Timed

    scheduler = Timed([[] for _ in range(3)], [2.5] * 3)  # each decode 2.5 s: behind, a guess every 5 s of speech
    async with running_tasks() as tasks:
        s = session(tasks, tiny_whisper_dir, NO_VAD, scheduler, max_lag_s=4.0)  # type: ignore[arg-type]
        s.live._clock = lambda: scheduler.now
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.pump)
            s.append(f32(voiced(1.0)), F32)
            await s.caught_up()
            assert len(scheduler.requests) == 1 and s.lag_seconds == 0  # the first guess, slow
            for _ in range(4):
                s.append(f32(voiced(1.0)), F32)
            await s.caught_up()
            assert len(scheduler.requests) == 1 and s.lag_seconds == pytest.approx(4.0)  # no guess before 5 s
            for _ in range(2):  # refused: the session holds all it may; the refusal makes a guess over it due
                with pytest.raises(AudioLimitExceeded) as err:
                    s.append(f32(voiced(1.0)), F32)
                assert err.value.code == "session_backlog_full"
            await s.caught_up()
            assert len(scheduler.requests) == 2 and len(scheduler.requests[-1].audio) == 5 * SR
            assert s.lag_seconds == 0 and items(s, "audio_committed") == []  # a guess: no utterance cut mid-word
            s.append(f32(voiced(1.0)), F32)  # the retry is taken
            assert s.received_seconds == pytest.approx(6.0)
            s.cancel()


async def test_an_ended_session_lets_go_of_the_model_without_a_collection(tiny_whisper_dir: Path) -> None:
    # A serving process rarely runs full collections: a model held only through an ended session's reference
    # cycles stayed, one copy per session (tiny.en: +145 MiB of MLX memory a session).
    import gc
    import weakref

    gc.disable()
    try:
        async with running_tasks() as tasks:
            residency = WhisperResidency(tiny_whisper_dir, tasks, dtype="float32")  # unloads when idle
            s = LiveSession(FAST, residency, WhisperScheduler(tasks), tasks, config=LiveConfig())
            async with anyio.create_task_group() as tg:
                tg.start_soon(s.pump)
                s.append(f32(np.concatenate([voiced(2), silence(1)])), F32)
                await s.caught_up()
                assert residency.loaded is not None
                model = weakref.ref(residency.loaded)
                await s.finish()
            await tasks.run(lambda: None)  # the unload queued at the session's release runs first
            assert residency.loaded is None and residency.loads == 1
        assert model() is None, "the ended session still reaches the model"
    finally:
        gc.enable()


async def test_what_the_reader_has_read_leaves_the_log(tiny_whisper_dir: Path) -> None:
    # A live socket answers every client event with a reply marked in the log: a million of them kept ~200 MB.
    async with running_tasks() as tasks:
        s = session(tasks, tiny_whisper_dir)
        read: list[str | None] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.pump)

            async def reader() -> None:
                async for event in s.events():
                    read.append(event.ref)
                    if len(read) == 2000:
                        return

            tg.start_soon(reader)
            for i in range(2000):
                s.mark(f"r{i}")
                if i % 100 == 0:
                    await anyio.sleep(0)  # the reader's turn, as the socket's writer gets it
            await settle()
            assert read == [f"r{i}" for i in range(2000)]  # in order, none lost to the trimming
            assert len(s.events_log) <= 256
            tg.cancel_scope.cancel()
