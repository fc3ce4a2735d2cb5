"""audio/sessions.py: the gate keeps running while a decode is in flight — a pause (VAD or commit()) that
closes the utterance a probe is decoding cancels that probe and the final decode starts without waiting for
it; a final decode is never cancelled. Orders of events only, with a scripted scheduler whose decodes the
test holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from audio.decoder import RowResult
from audio.live import LiveConfig
from audio.pcm import PcmFormat
from audio.window import WindowRequest, WindowResult
from audio.sessions import LiveSession
from audio.transcript import TranscribeOptions
from audio.whisper import WhisperResidency
from tests.audio.conftest import SR, running_tasks, voiced
from tests.fixtures.settle import settle

pytestmark = pytest.mark.anyio
FAST = TranscribeOptions(temperatures=(0.0,))
F32 = PcmFormat()
TEXT = [1000, 1002]  # any text tokens of the tiny model


def f32(x: np.ndarray) -> bytes:
    return x.astype("<f4").tobytes()


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SR), np.float32)


class Held:
    """A scheduler whose decodes number `hold` wait for `release` (or their cancellation); the others return
    TEXT at once. `log` records each decode's start, end and cancellation, in order."""

    def __init__(self, hold: set[int], fail: set[int] | None = None) -> None:
        self.hold, self.fail = hold, fail or set()
        self.log: list[tuple[str, int]] = []
        self.scopes: list[Any] = []
        self.held = anyio.Event()
        self.release = anyio.Event()

    def chat_active(self) -> bool:
        return True

    async def decode(self, loaded: Any, request: WindowRequest, cancellation: Any = None) -> WindowResult:
        i = len(self.scopes)
        self.scopes.append(cancellation)
        self.log.append(("start", i))
        if i in self.hold:
            self.held.set()
            try:
                await self.release.wait()
            except anyio.get_cancelled_exc_class():
                self.log.append(("cancelled", i))
                raise
            self.log.append(("end", i))
        if i in self.fail:
            raise ValueError(f"decode {i} failed")
        tokens = list(request.prefix) + TEXT
        return WindowResult(RowResult(tokens, TEXT, "", -0.1, 0.01, 0.0, 1.0), "en")


def session(tasks: Any, whisper_dir: Path, scheduler: Held) -> LiveSession:
    residency = WhisperResidency(whisper_dir, tasks, dtype="float32", resident=True)
    return LiveSession(FAST, residency, scheduler, tasks, config=LiveConfig(redecode_s=1.0,  # type: ignore[arg-type]
                                                                             first_redecode_s=0.75))


async def pause_during_the_probe(whisper_dir: Path, close: str) -> tuple[LiveSession, Held]:
    """2 s of speech (a probe starts and is held), then the utterance is closed (`close`: a VAD pause or
    commit()) while the probe waits; the probe is let go only once every task is blocked."""
    scheduler = Held({0})
    async with running_tasks() as tasks:
        s = session(tasks, whisper_dir, scheduler)
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.pump)
            s.append(f32(voiced(2.0)), F32)
            await scheduler.held.wait()
            if close == "vad":
                s.append(f32(silence(1.0)), F32)
            else:
                s.commit()
            await settle()  # the pump did all it could before the probe's end
            scheduler.release.set()
            await s.finish()
    return s, scheduler


@pytest.mark.parametrize("close", ["vad", "commit"])
async def test_a_pause_during_a_probe_cancels_it_and_the_final_decode_starts_at_once(
        tiny_whisper_dir: Path, close: str) -> None:
    s, scheduler = await pause_during_the_probe(tiny_whisper_dir, close)
    # the probe never completed: cancelled, then the final decode of the utterance
    assert scheduler.log[:3] == [("start", 0), ("cancelled", 0), ("start", 1)]
    assert ("end", 0) not in scheduler.log and scheduler.scopes[0].cancel_called
    assert not scheduler.scopes[1].cancel_called  # the final decode is bound to the session, not cancelled
    kinds = [(e.type, e.item) for e in s.events_log]
    # nothing from the probe: the first text is the final decode's, committed after the pause
    assert kinds.index(("audio_committed", 0)) < kinds.index(("committed", 0)) < kinds.index(("utterance", 0))
    assert [e.type for e in s.events_log if e.item == 0 and e.type in ("tentative", "committed")][0] == "committed"
    assert s.committed_text() == [e.text for e in s.events_log if e.type == "utterance"][0]
    # a client's commit ends the speech itself: OpenAI's server VAD then sends no speech_stopped
    assert [e.item for e in s.events_log if e.type == "speech_stopped"] == ([] if close == "commit" else [0])


async def test_a_pause_seen_during_a_final_decode_waits_for_it(tiny_whisper_dir: Path) -> None:
    scheduler = Held({0})
    async with running_tasks() as tasks:
        s = session(tasks, tiny_whisper_dir, scheduler)
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.pump)
            s.append(f32(np.concatenate([voiced(0.5), silence(1.0)])), F32)  # too short for a probe: a final
            await scheduler.held.wait()
            s.append(f32(np.concatenate([voiced(1.0), silence(1.0)])), F32)  # the next utterance, ended
            await settle()
            # seen while the first utterance's final decode runs: its pause is there, nothing is cancelled
            assert [(e.type, e.item) for e in s.events_log if e.type == "speech_stopped"] == [
                ("speech_stopped", 0), ("speech_stopped", 1)]
            assert scheduler.log == [("start", 0)]
            scheduler.release.set()
            await s.finish()
    assert scheduler.log[:3] == [("start", 0), ("end", 0), ("start", 1)]
    assert [e.item for e in s.events_log if e.type == "utterance"] == [0, 1]
    committed = [e.item for e in s.events_log if e.type == "committed"]
    assert committed == sorted(committed) and s.committed_text()


async def test_a_failed_decode_reaches_finish_as_its_own_error(tiny_whisper_dir: Path) -> None:
    scheduler = Held(set(), fail={0})
    async with running_tasks() as tasks:
        s = session(tasks, tiny_whisper_dir, scheduler)
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.pump)
            s.append(f32(voiced(2.0)), F32)
            with pytest.raises(ValueError, match="decode 0 failed"):  # not wrapped in an ExceptionGroup
                await s.finish()
