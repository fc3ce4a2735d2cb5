"""audio/speech.py: the SpeechService facade on a running loop — files, the VAD gate, session registry."""

from __future__ import annotations

from pathlib import Path

import anyio
import numpy as np
import pytest

from audio.pcm import PcmFormat
from audio.sessions import SessionNotFound
from audio.speech import SpeechService
from audio.transcript import Segment, Transcript
from tests.audio.conftest import SR, running_tasks, voiced


def service(tasks, tiny_whisper_dir: Path, **kwargs) -> SpeechService:
    return SpeechService(tasks, tiny_whisper_dir, dtype="float32", **kwargs)


@pytest.mark.anyio
async def test_file_transcription_streams_windows_then_the_transcript(tiny_whisper_dir: Path) -> None:
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir)
        options = speech.options(temperatures=(0.0,), without_timestamps=True)
        items = [item async for item in speech.transcribe_stream(voiced(35), options)]
        assert isinstance(items[-1], Transcript) and all(isinstance(i, list) for i in items[:-1])
        assert all(isinstance(s, Segment) for batch in items[:-1] for s in batch)
        assert items[-1].duration == pytest.approx(35.0)
        assert speech.residency.loads == 1 and speech.residency.takes == 0
        await tasks.run(lambda: None)
        assert speech.residency.loaded is None  # idle_unload 0


@pytest.mark.anyio
async def test_vad_gate_returns_empty_text_without_loading_whisper(tiny_whisper_dir: Path) -> None:
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir)
        t = await speech.transcribe(np.zeros(5 * SR, np.float32), speech.options(vad=True))
        assert t.text == "" and t.segments == [] and t.duration == 5.0
        assert speech.residency.loads == 0 and tasks.completed == 0


@pytest.mark.anyio
async def test_vad_trim_offsets_timestamps(tiny_whisper_dir: Path) -> None:
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir)
        pcm = np.concatenate([np.zeros(4 * SR, np.float32), voiced(2)])
        t = await speech.transcribe(pcm, speech.options(vad_trim=True, temperatures=(0.0,), without_timestamps=True))
        assert t.duration == 6.0
        assert all(s.start >= 3.8 for s in t.segments) and t.segments


def test_options_are_checked_against_the_model(tiny_whisper_dir: Path) -> None:
    speech = SpeechService(None, tiny_whisper_dir)  # type: ignore[arg-type]
    assert not speech.multilingual
    assert speech.options(language="English").language == "en"
    for bad in ({"language": "de"}, {"language": "klingon"}, {"task": "translate"}):
        with pytest.raises(ValueError):
            speech.options(**bad)


@pytest.mark.anyio
async def test_sessions_registry_ttl_and_delete(tiny_whisper_dir: Path) -> None:
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir, session_ttl_sec=60)
        with pytest.raises(RuntimeError):
            speech.create_session(speech.options())
        async with anyio.create_task_group() as tg:
            await tg.start(speech.run)
            a = speech.create_session(speech.options())
            b = speech.create_session(speech.options())
            a.append(voiced(0.5).tobytes(), PcmFormat())
            assert speech.get_session(a.id) is a
            speech.delete_session(b.id)
            with pytest.raises(SessionNotFound):
                speech.get_session(b.id)
            speech._expire(a.last_active + 61)
            with pytest.raises(SessionNotFound):
                speech.get_session(a.id)
            assert speech.expired == 1 and a.closed
            tg.cancel_scope.cancel()
