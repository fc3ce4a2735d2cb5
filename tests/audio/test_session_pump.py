"""audio/session_pump.py: the gate a live session's audio passes through, and a pump that ends cancelled or failed
lets go of the model. (The pump itself runs in every LiveSession test: tests/audio/test_sessions.py.)"""

from __future__ import annotations

import contextlib
import gc
import traceback
import weakref
from pathlib import Path
from typing import Iterator

import anyio
import pytest

from audio.errors import InvalidOption
from audio.live import LiveConfig
from audio.pcm import PcmFormat
from audio.scheduler import WhisperScheduler
from audio.session_pump import speech_gate
from audio.sessions import LiveSession
from audio.transcript import TranscribeOptions
from audio.whisper import LoadedWhisper, WhisperResidency
from audio.window import WindowRequest, WindowResult
from tests.audio.conftest import SR, running_tasks, voiced

FAST = TranscribeOptions(temperatures=(0.0,))


def test_vad_settings_reach_the_gate() -> None:
    gate = speech_gate(TranscribeOptions(vad_min_silence_ms=900, vad_padding_ms=300, vad_aggressiveness=3))
    assert gate is not None and gate._gap == 30 and gate._pad == 300 * SR // 1000
    assert speech_gate(TranscribeOptions(temperatures=(0.0,), vad=False)) is None
    with pytest.raises(InvalidOption):
        TranscribeOptions(vad_aggressiveness=4)


class _Decoding:
    """WhisperScheduler.decode, telling when a window is in flight; `fails`: its windows raise instead."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fails: bool = False) -> None:
        self.started = anyio.Event()
        real = WhisperScheduler.decode

        async def decode(scheduler: WhisperScheduler, loaded: LoadedWhisper, request: WindowRequest,
                         scope: anyio.CancelScope | None = None) -> WindowResult:
            self.started.set()
            if fails:
                raise RuntimeError("the window failed")
            return await real(scheduler, loaded, request, scope)

        monkeypatch.setattr(WhisperScheduler, "decode", decode)


@contextlib.contextmanager
def _no_collections() -> Iterator[None]:
    # A serving process rarely runs a full collection: what only a collection frees stays (audio/exception_frames.py)
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.anyio
async def test_a_session_cancelled_mid_window_lets_go_of_the_model(tiny_whisper_dir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # A Realtime socket ended mid-utterance: its cancelled window's frames kept tiny.en after the unload (147.7 MiB).
    decoding = _Decoding(monkeypatch)
    with _no_collections():
        async with running_tasks() as tasks:
            residency = WhisperResidency(tiny_whisper_dir, tasks, dtype="float32")  # unloads when idle
            s = LiveSession(FAST, residency, WhisperScheduler(tasks), tasks, config=LiveConfig())
            async with anyio.create_task_group() as tg:
                tg.start_soon(s.pump)
                s.append(voiced(4).astype("<f4").tobytes(), PcmFormat())  # speech, no pause: guesses
                await decoding.started.wait()
                assert residency.loaded is not None
                model = weakref.ref(residency.loaded)
                s.cancel()
                await s.ended()
            await tasks.run(lambda: None)  # the unload queued at the session's release runs first
            assert residency.loaded is None and residency.unloads == 1
        assert model() is None, "the cancelled window still reaches the model"


@pytest.mark.anyio
async def test_a_failed_sessions_kept_error_does_not_keep_the_model(tiny_whisper_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # The error waits for the session's finish (or its deletion); the frames it passed hold the model.
    _Decoding(monkeypatch, fails=True)
    with _no_collections():
        async with running_tasks() as tasks:
            residency = WhisperResidency(tiny_whisper_dir, tasks, dtype="float32")
            s = LiveSession(FAST, residency, WhisperScheduler(tasks), tasks, config=LiveConfig())
            async with anyio.create_task_group() as tg:
                tg.start_soon(s.pump)
                s.append(voiced(4).astype("<f4").tobytes(), PcmFormat())
                await s.ended()
                assert residency.loads == 1
                model = weakref.ref(residency.loaded) if residency.loaded is not None else None
            await tasks.run(lambda: None)
            assert residency.loaded is None and isinstance(s.error, RuntimeError)
            assert "the window failed" in "".join(traceback.format_exception(s.error))  # still says where
        assert model is not None and model() is None, "the session's error still reaches the model"
