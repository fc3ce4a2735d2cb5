"""Whisper's warm-up: each kind of step run once before clients come.

On a GPU MLX compiles a kernel module the first time it meets it (a gather of a new dtype, a sampler's
kernels...) under one process-wide lock that every thread's launches wait on. Left to the first live window,
those compiles stalled every chat stream beside it for seconds (H200: one chat step of 6.3 s).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import anyio
import numpy as np

from audio.pcm import SAMPLE_RATE

if TYPE_CHECKING:
    from audio.speech import SpeechService

__all__ = ["compiles_kernels", "warm_up_signal", "warm_up_speech"]


def compiles_kernels() -> bool:
    """Whether MLX computes on a GPU here (it compiles per kernel there; the CPU backend has nothing to warm).
    Raises nothing."""
    import mlx.core as mx

    return bool(mx.default_device().type == mx.DeviceType.gpu)


def warm_up_signal(seconds: float) -> np.ndarray:
    """A buzzing vowel, 16 kHz float32: webrtcvad takes it for speech; the text Whisper makes of it does not
    matter. Raises nothing."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    saw = ((t * 150.0) % 1.0 - 0.5) * 0.5
    return (saw * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)


async def warm_up_speech(speech: "SpeechService") -> float:
    """Two files at once (stacked encoder units, batched decoder rows, a greedy and a sampled decode, language
    detection on a multilingual model) and a live session fed half a second at a time (its guesses and its
    final), all through `speech`'s scheduler; then its counters and measured step costs are reset (compiles are
    not serving costs). `speech.run()` must be running. Returns the seconds taken. Raises
    WhisperCheckpointError, SpeechNotRunning, what a window raises."""
    t0 = time.perf_counter()
    signal = warm_up_signal(3.0)
    greedy = speech.options(vad=False, temperatures=(0.0,))
    sampled = speech.options(vad=False, temperatures=(0.6,), language=None if speech.multilingual else "en")

    async def live() -> None:
        session = speech.create_session(greedy, expires=False)
        try:
            for piece in np.array_split(signal, 6):
                session.append_samples(piece)
                await session.caught_up()
            await session.finish()
        finally:
            speech.delete_session(session.id)

    await speech.residency.take()  # loaded through the warm-up, whatever the idle policy
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(speech.transcribe, signal[: len(signal) * 2 // 3], greedy)
            tg.start_soon(speech.transcribe, signal, sampled)
            tg.start_soon(live)
    finally:
        speech.residency.release()
    speech.scheduler.forget_measurements()
    return time.perf_counter() - t0
