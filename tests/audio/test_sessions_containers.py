"""audio/sessions.py with container chunks: a MediaRecorder's stream appended piece by piece is all transcribed — the
tail its decoder held back comes in at the finish, before raw audio sent after it, or at an expiry — and a session
that ends (cancelled, deleted, even while a chunk starts a stream) leaves no decoder thread behind; a chunk refused for
a limit is never fed to its stream twice, and is decoded no further than the session can take."""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import numpy as np
import pytest

from audio.errors import AudioInputError, AudioLimitExceeded, SessionAudioLimit, SessionBacklogFull, SessionClosed
from audio.live import LiveConfig
from audio.pcm import SAMPLE_RATE, PcmFormat, decode_container
from audio.scheduler import WhisperScheduler
from audio.sessions import LiveSession
from audio.transcript import TranscribeOptions
from audio.whisper import WhisperResidency
from engine.tasks import ExecutionTasks
from tests.audio.conftest import running_tasks
from tests.fixtures.container_streams import STREAM_KINDS, encode, pieces, tone

pytestmark = pytest.mark.anyio
FAST = TranscribeOptions(temperatures=(0.0,))


def session(tasks: ExecutionTasks, whisper_dir: Path, config: LiveConfig | None = None) -> LiveSession:
    residency = WhisperResidency(whisper_dir, tasks, dtype="float32", resident=True)
    return LiveSession(FAST, residency, WhisperScheduler(tasks), tasks, config=config or LiveConfig())


def decoders() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("decode-") and t.is_alive()]


@pytest.mark.parametrize("name", STREAM_KINDS)
async def test_a_stream_in_pieces_is_all_transcribed(tiny_whisper_dir: Path, name: str) -> None:
    data = encode(name, tone(2.0))
    whole = len(decode_container(data))
    async with running_tasks() as tasks:
        s = session(tasks, tiny_whisper_dir)
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.pump)
            taken = [await s.append_container(p) for p in pieces(data, 8)]
            assert all(n > 0 for n in taken) and s._raw.total == sum(taken) < whole  # the tail is still held
            t = await s.finish()
    assert t.duration == pytest.approx(whole / SAMPLE_RATE, abs=1e-6)  # ... and came in at the finish
    assert not decoders()


async def test_raw_audio_after_a_stream_comes_after_its_tail(tiny_whisper_dir: Path) -> None:
    data = encode("webm", tone(1.0))
    async with running_tasks() as tasks:
        s = session(tasks, tiny_whisper_dir)
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.pump)
            for p in pieces(data, 4):
                await s.append_container(p)
            s.append(np.zeros(SAMPLE_RATE // 2, "<f4").tobytes(), PcmFormat())
            assert s._raw.total == len(decode_container(data)) + SAMPLE_RATE // 2
            assert not decoders()  # the stream closed there
            await s.finish()


async def test_a_bad_chunk_is_refused_and_the_audio_before_it_kept(tiny_whisper_dir: Path) -> None:
    parts = pieces(encode("mp4", tone(2.0)), 8)
    async with running_tasks() as tasks:
        s = session(tasks, tiny_whisper_dir)
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.pump)
            before = sum([await s.append_container(p) for p in parts[:3]])
            with pytest.raises(AudioInputError) as refused:
                await s.append_container(b"\x00\x00\x00\x10junk" + bytes(range(256)) * 8)
            assert refused.value.code == "unsupported_or_corrupt_audio" and s._raw.total == before
            with pytest.raises(AudioInputError) as headerless:
                await s.append_container(parts[3])
            assert headerless.value.code == "missing_stream_header"
            t = await s.finish()
    assert t.duration == pytest.approx(before / SAMPLE_RATE)


async def test_a_cancelled_or_expired_session_leaves_no_decoder_thread(tiny_whisper_dir: Path) -> None:
    first = pieces(encode("ogg", tone(1.0)), 4)[:2]
    async with running_tasks() as tasks:
        cancelled, expired = session(tasks, tiny_whisper_dir), session(tasks, tiny_whisper_dir)
        async with anyio.create_task_group() as tg:
            tg.start_soon(cancelled.pump)
            tg.start_soon(expired.pump)
            for s in (cancelled, expired):
                for p in first:
                    await s.append_container(p)
            assert len(decoders()) == 2
            held = expired._raw.total
            cancelled.cancel()
            expired.expire("idle")  # its held audio is transcribed, the stream's tail with it
            assert expired._raw.total > held
            await expired.ended()
            with pytest.raises(SessionClosed):
                await cancelled.append_container(first[1])
    for thread in decoders():
        thread.join(5)
    assert not decoders()


async def test_a_chunk_refused_for_the_backlog_is_taken_once_on_its_retry(tiny_whisper_dir: Path) -> None:
    # the refusal came after the decoder consumed the chunk: its retry fed the same bytes again (FFmpeg lost its place
    # in a WebM stream: 21.8 s of a 61.3 s recording), or its audio was lost
    data = encode("webm", tone(2.0))
    parts = pieces(data, 8)
    async with running_tasks() as tasks:
        s = session(tasks, tiny_whisper_dir, LiveConfig(max_lag_s=0.6))  # no pump yet: the lag only grows
        for p in parts[:2]:
            await s.append_container(p)
        with pytest.raises(SessionBacklogFull):
            await s.append_container(parts[2])
        s.config = LiveConfig()  # the session caught up
        for p in parts[2:]:
            await s.append_container(p)  # the refused chunk first, sent again as it was
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.pump)
            t = await s.finish()
    assert t.duration == pytest.approx(len(decode_container(data)) / SAMPLE_RATE, abs=1e-6)


async def test_a_refusal_no_retry_gets_past_ends_the_stream(tiny_whisper_dir: Path) -> None:
    parts = pieces(encode("ogg", tone(2.0)), 8)
    async with running_tasks() as tasks:
        s = session(tasks, tiny_whisper_dir, LiveConfig(max_session_s=0.6))
        for p in parts[:2]:
            await s.append_container(p)
        with pytest.raises(SessionAudioLimit):
            await s.append_container(parts[2])
        with pytest.raises(AudioInputError) as after:  # refused as one that continues no stream, saying why
            await s.append_container(parts[3])
        assert after.value.code == "missing_stream_header" and "Ogg stream ended at a chunk" in after.value.message
        s.cancel()


@pytest.mark.parametrize("config, cap", [(LiveConfig(max_lag_s=1.0), 1.0),
                                         (LiveConfig(max_session_s=3.0, max_lag_s=None), 3.0)])
async def test_a_chunk_is_decoded_no_further_than_the_session_can_take(tiny_whisper_dir: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        config: LiveConfig, cap: float) -> None:
    # decoded up to the server's 7200 s: 737 KB of FLAC became 1 h, 630 MB and 5 s of CPU before the 413
    async with running_tasks() as tasks:
        s = session(tasks, tiny_whisper_dir, config)
        caps: list[float | None] = []
        decode = s._containers.decode
        monkeypatch.setattr(s._containers, "decode", lambda body, most=None: caps.append(most) or decode(body, most))
        with pytest.raises(AudioLimitExceeded) as refused:
            await s.append_container(encode("webm", tone(5.0)), max_seconds=7200.0)
        assert caps == [cap] and refused.value.code in ("chunk_too_long", "session_audio_limit")
        assert s.received_seconds == 0
        s.cancel()


async def test_a_delete_racing_a_chunk_that_starts_a_stream_leaves_no_decoder(tiny_whisper_dir: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # the cancel came while the stream before closed in a worker thread: the chunk then opened a new one no one stopped
    first, second = pieces(encode("webm", tone(1.0)), 4)[0], pieces(encode("ogg", tone(1.0)), 4)[0]
    async with running_tasks() as tasks:
        s = session(tasks, tiny_whisper_dir)
        await s.append_container(first)
        tail_before = s._containers.tail_before

        def cancelled_meanwhile(body: bytes) -> np.ndarray:
            tail = tail_before(body)
            anyio.from_thread.run_sync(s.cancel)
            return tail

        monkeypatch.setattr(s._containers, "tail_before", cancelled_meanwhile)
        with pytest.raises(SessionClosed):
            await s.append_container(second)
    for thread in decoders():
        thread.join(5)
    assert not decoders()
