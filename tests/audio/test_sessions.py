"""audio/sessions.py: windows queue while capture goes on, finish costs the rest, cancel drops queued work.

The loop is stepped by hand (ExecutionTasks.advance on a real engine thread) so the order of events is
observed exactly, without timing.
"""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator

import anyio
import numpy as np
import pytest

from audio.pcm import AudioInputError, PcmFormat
from audio.sessions import AudioBuffer, LiveSession, SessionClosed
from audio.transcript import TranscribeOptions
from audio.whisper import WhisperResidency
from engine.context import EngineThread
from engine.tasks import ExecutionTasks, TaskRejected
from tests.audio.conftest import SR, voiced

FAST = TranscribeOptions(temperatures=(0.0,), without_timestamps=True)
F32 = PcmFormat()


def f32(x: np.ndarray) -> bytes:
    return x.astype("<f4").tobytes()


def test_audio_buffer_addresses_absolute_samples() -> None:
    b = AudioBuffer()
    b.append(np.arange(10, dtype=np.float32))
    b.discard_before(4)
    b.append(np.arange(10, 20, dtype=np.float32))
    assert b.total == 20 and b.base == 4
    np.testing.assert_array_equal(b.view(8, 4), [8, 9, 10, 11])
    np.testing.assert_array_equal(b.view(18, 10), [18, 19])


@pytest.fixture
def thread() -> EngineThread:
    t = EngineThread("test-sessions")
    yield t
    t.close()


async def settle() -> None:
    await anyio.wait_all_tasks_blocked()


async def step(tasks: ExecutionTasks, thread: EngineThread) -> None:
    """One loop iteration's task slot."""
    assert await tasks.advance(thread)
    await settle()


@pytest.mark.anyio
async def test_full_windows_run_during_capture_and_finish_costs_one(tiny_whisper_dir: Path, thread: EngineThread) -> None:
    tasks = ExecutionTasks()
    residency = WhisperResidency(tiny_whisper_dir, tasks, dtype="float32", idle_unload_sec=0)
    session = LiveSession(FAST, residency, tasks)
    async with anyio.create_task_group() as tg:
        tg.start_soon(session.pump)
        pcm = voiced(65)
        chunk = SR // 4
        for i in range(0, 31 * SR, chunk):  # 31 s in 250 ms chunks: nothing queued before a full window
            session.append(f32(pcm[i:i + chunk]), F32)
            if i + chunk < 30 * SR:
                await settle()
                assert tasks.labels() == []
        await settle()
        assert tasks.labels() == ["whisper.load"]
        await step(tasks, thread)
        assert tasks.labels() == [f"whisper.window:{session.id}"]
        await step(tasks, thread)
        assert session.windows_done == 1 and tasks.labels() == []
        for i in range(31 * SR, 65 * SR, chunk):  # capture goes on; the second full window queues itself
            session.append(f32(pcm[i:i + chunk]), F32)
        await settle()
        assert tasks.labels() == [f"whisper.window:{session.id}"]
        await step(tasks, thread)
        assert session.windows_done == 2
        finishing = anyio.Event()
        result = []

        async def finish() -> None:
            result.append(await session.finish())
            finishing.set()

        tg.start_soon(finish)
        await settle()
        assert tasks.labels() == [f"whisper.window:{session.id}"]  # exactly one window left at finish
        await step(tasks, thread)
        await finishing.wait()
        assert session.windows_done == 3
        assert result[0].duration == pytest.approx(65.0, abs=0.01)
        assert tasks.labels() == ["whisper.unload"]  # idle_unload 0: the model goes after the take


@pytest.mark.anyio
async def test_cancel_drops_queued_windows(tiny_whisper_dir: Path, thread: EngineThread) -> None:
    tasks = ExecutionTasks()
    residency = WhisperResidency(tiny_whisper_dir, tasks, dtype="float32")
    session = LiveSession(FAST, residency, tasks)
    async with anyio.create_task_group() as tg:
        tg.start_soon(session.pump)
        session.append(f32(voiced(31)), F32)
        await settle()
        await step(tasks, thread)  # the load
        assert tasks.labels() == [f"whisper.window:{session.id}"]
        session.cancel()
        assert tasks.prune() == 1 and tasks.labels() == []
        await settle()
        assert session.windows_done == 0 and session._transcription.windows == 0
        with pytest.raises(SessionClosed):
            session.append(f32(voiced(1)), F32)
        with pytest.raises(SessionClosed):
            await session.finish()
    assert residency.takes == 0


@pytest.mark.anyio
async def test_a_bad_chunk_keeps_earlier_audio_and_audio_after_finish_is_refused(tiny_whisper_dir: Path,
                                                                                  thread: EngineThread) -> None:
    tasks = ExecutionTasks()
    session = LiveSession(FAST, WhisperResidency(tiny_whisper_dir, tasks, dtype="float32"), tasks)
    async with anyio.create_task_group() as tg:
        tg.start_soon(session.pump)
        session.append(f32(voiced(1)), F32)
        for bad, fmt in ((b"\x00" * 7, F32), (f32(np.array([np.nan] * 4)), F32), (b"", F32)):
            with pytest.raises(AudioInputError):
                session.append(bad, fmt)
        assert session.received_seconds == pytest.approx(1.0)
        session.append(((voiced(0.5) * 32767).astype("<i2")).tobytes(), PcmFormat(48000, "s16le"))
        done = anyio.Event()

        async def finish() -> None:
            await session.finish()
            done.set()

        tg.start_soon(finish)
        await settle()
        while not done.is_set():
            await step(tasks, thread) if tasks.pending else await settle()
        assert session.received_seconds == pytest.approx(1.0 + 0.5 / 3, abs=0.01)
        with pytest.raises(SessionClosed):
            session.append(f32(voiced(1)), F32)


@pytest.mark.anyio
async def test_finish_without_audio_loads_nothing(tiny_whisper_dir: Path) -> None:
    tasks = ExecutionTasks()
    residency = WhisperResidency(tiny_whisper_dir, tasks)
    session = LiveSession(FAST, residency, tasks)
    async with anyio.create_task_group() as tg:
        tg.start_soon(session.pump)
        t = await session.finish()
    assert t.text == "" and t.duration == 0 and residency.loads == 0 and tasks.labels() == []


@pytest.mark.anyio
async def test_vad_skips_silent_windows(tiny_whisper_dir: Path, thread: EngineThread) -> None:
    tasks = ExecutionTasks()
    options = TranscribeOptions(temperatures=(0.0,), without_timestamps=True, vad=True)
    session = LiveSession(options, WhisperResidency(tiny_whisper_dir, tasks, dtype="float32"), tasks)
    async with anyio.create_task_group() as tg:
        tg.start_soon(session.pump)
        session.append(f32(np.zeros(31 * SR, np.float32)), F32)
        await settle()
        await step(tasks, thread)  # load; the silent window then never becomes a task
        assert tasks.labels() == [] and session._transcription.seek == 3000
        session.cancel()
