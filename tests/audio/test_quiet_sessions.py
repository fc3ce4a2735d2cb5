"""A live session from a quiet microphone (audio/vad.py's live level, through audio/sessions.py): its speech is
gated, marked and decoded as at an ordinary level, while room tone as quiet never reaches Whisper. A scripted
scheduler stands in for Whisper: what is asked of it is the test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import anyio

from audio.decoder import RowResult
from audio.live import LiveConfig
from audio.pcm import PcmFormat
from audio.sessions import LiveSession
from audio.transcript import TranscribeOptions
from audio.whisper import WhisperResidency
from audio.window import WindowRequest, WindowResult
from tests.audio.conftest import SR, running_tasks
from tests.audio.test_vad import noise, quiet_talk

pytestmark = pytest.mark.anyio
S16 = PcmFormat(encoding="s16le")  # as a Realtime client sends it, 16-bit
TEXT = [1000, 1002]  # any text tokens of the tiny model


class Recorder:
    """A scheduler that records the audio of each decode asked of it and answers TEXT at once."""

    def __init__(self) -> None:
        self.decoded: list[int] = []

    def chat_active(self) -> bool:
        return False

    async def decode(self, loaded: Any, request: WindowRequest, cancellation: Any = None) -> WindowResult:
        self.decoded.append(len(request.audio))
        return WindowResult(RowResult(list(request.prefix) + TEXT, TEXT, "", -0.1, 0.01, 0.0, 1.0), "en")


async def run_session(whisper_dir: Path, pcm: np.ndarray, aggressiveness: int = 2) -> tuple[LiveSession, Recorder]:
    """`pcm` sent as 16-bit PCM in 100 ms chunks, each gated before the next comes, then finished."""
    scheduler = Recorder()
    async with running_tasks() as tasks:
        residency = WhisperResidency(whisper_dir, tasks, dtype="float32", resident=True)
        options = TranscribeOptions(temperatures=(0.0,), vad_aggressiveness=aggressiveness)
        s = LiveSession(options, residency, scheduler, tasks, config=LiveConfig())  # type: ignore[arg-type]
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.pump)
            chunk = SR // 10
            for i in range(0, len(pcm), chunk):
                s.append((np.round(pcm[i:i + chunk] * 32768).clip(-32768, 32767)).astype("<i2").tobytes(), S16)
                await s.caught_up()
            await s.finish()
    return s, scheduler


def marks(s: LiveSession) -> list[tuple[str, int]]:
    return [(e.type, e.audio_ms or 0) for e in s.events_log if e.type in ("speech_started", "speech_stopped")]


@pytest.mark.parametrize("peak, floor", [(-60.0, -100.0), (-72.0, None)])
async def test_a_quiet_microphone_session_is_gated_as_a_loud_one(tiny_whisper_dir: Path, peak: float,
                                                                  floor: float | None) -> None:
    # a session heard speech at the audio's own level: peaks under about -55 dBFS started no speech, decoded
    # nothing and answered ""
    quiet, bursts = quiet_talk(peak, floor)
    loud, _ = quiet_talk(-12.0, None if floor is None else floor - peak - 12.0)
    s, scheduler = await run_session(tiny_whisper_dir, quiet)
    reference, _ = await run_session(tiny_whisper_dir, loud)
    got, want = marks(s), marks(reference)
    assert [k for k, _ in got] == ["speech_started", "speech_stopped"] * 2
    # starts within a frame; a word's fading end may lie under one 16-bit step, digital silence
    assert all(abs(a - b) <= (30 if k == "speech_started" else 200) for (k, a), (_, b) in zip(got, want)), (got, want)
    assert got[0][1] <= bursts[0][0] * 1000 // SR  # the first word is not cut
    assert scheduler.decoded and s.committed_text()


async def test_quiet_room_tone_never_reaches_whisper(tiny_whisper_dir: Path) -> None:
    # lifted like the speech it might carry, room tone stays silence, even at the Realtime threshold's most
    # permissive (0–0.25: aggressiveness 0) and after digital silence that ends mid-frame, as a microphone opens
    tone = np.concatenate([np.zeros(8100, np.float32), noise("pink", 20.0, -85.0) + noise("hum50", 20.0, -90.0)])
    s, scheduler = await run_session(tiny_whisper_dir, tone, aggressiveness=0)
    assert s.events_log == [] and scheduler.decoded == []
