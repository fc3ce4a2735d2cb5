"""audio/file_transcription.py: a file's transcription cancelled mid-window (its client gone) lets go of the model."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import anyio
import pytest

from audio.scheduler import WhisperScheduler
from audio.speech import SpeechService
from audio.whisper import LoadedWhisper
from audio.window import WindowRequest, WindowResult
from tests.audio.conftest import running_tasks, voiced

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("batch_size", [1, 2])
async def test_a_file_cancelled_mid_window_lets_go_of_the_model(tiny_whisper_dir: Path, batch_size: int,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # Its reader's task cancelled (an SSE stream whose client left, --sse-keepalive 0): anyio's task group kept the
    # frames the cancellation passed, and the model in them, after the unload (audio/exception_frames.py).
    started = anyio.Event()
    real = WhisperScheduler.decode

    async def decode(scheduler: WhisperScheduler, loaded: LoadedWhisper, request: WindowRequest,
                     scope: anyio.CancelScope | None = None) -> WindowResult:
        started.set()
        return await real(scheduler, loaded, request, scope)

    monkeypatch.setattr(WhisperScheduler, "decode", decode)
    gc.collect()
    gc.disable()  # a serving process rarely runs a full collection
    try:
        async with running_tasks() as tasks:
            speech = SpeechService(tasks, tiny_whisper_dir, dtype="float32")  # unloads when idle
            options = speech.options(temperatures=(0.0,), vad=False, batch_size=batch_size)

            async def read() -> None:
                async for _ in speech.transcribe_stream(voiced(65), options):
                    pass

            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                await started.wait()
                assert speech.residency.loaded is not None
                model = weakref.ref(speech.residency.loaded)
                tg.cancel_scope.cancel()
            await tasks.run(lambda: None)  # the unload queued at the release runs first
            assert speech.residency.loaded is None and speech.residency.unloads == 1
        assert model() is None, "the cancelled window still reaches the model"
    finally:
        gc.enable()
