"""What Whisper's warm-up (SpeechService.warm_up) needs: whether to run it, and the audio it decodes.

On a GPU MLX compiles a kernel module the first time it meets it (a gather of a new dtype, a sampler's
kernels...) under one process-wide lock that every thread's launches wait on. Left to the first live window,
those compiles stalled every chat stream beside it for seconds (H200: one chat step of 6.3 s).
"""

from __future__ import annotations

import numpy as np

from audio.pcm import SAMPLE_RATE
from engine.accelerator import on_gpu

__all__ = ["compiles_kernels", "warm_up_signal"]


def compiles_kernels() -> bool:
    """Whether MLX computes on a GPU here (it compiles per kernel there; the CPU backend has nothing to warm).
    Raises nothing."""
    return on_gpu()


def warm_up_signal(seconds: float) -> np.ndarray:
    """A buzzing vowel, 16 kHz float32: webrtcvad takes it for speech; the text Whisper makes of it does not
    matter. Raises nothing."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    saw = ((t * 150.0) % 1.0 - 0.5) * 0.5
    return (saw * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)
