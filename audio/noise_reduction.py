"""A live session's noise reduction (OpenAI's Realtime `noise_reduction`): a high-pass filter over its input audio,
applied as it arrives (16 kHz, after the input format is decoded), before the VAD and Whisper hear it.

What it is, plainly: a 6th-order Butterworth high-pass (scipy.signal, second-order sections) whose state is carried
from chunk to chunk, so the audio filtered a chunk at a time is the audio filtered whole and chunk boundaries add no
clicks. It removes what lies below speech (rumble, mains hum, handling noise, HVAC), not noise inside the speech band:
no model cleans the audio as OpenAI's does. Its cut-off by microphone:
- `near_field` (a headset, a phone held to the ear): 80 Hz, below any voice's fundamental; rumble and hum go.
- `far_field` (a laptop or conference-room microphone): 120 Hz, as room rumble and HVAC carry more at a distance; a
  low voice's fundamental is thinned (100 Hz: 10 dB down), its harmonics, which Whisper reads, are not.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import numpy as np

from audio.pcm import SAMPLE_RATE

__all__ = ["NoiseReduction", "KINDS", "CUTOFF_HZ", "HighPass"]

NoiseReduction = Literal["near_field", "far_field"]
KINDS: tuple[str, ...] = get_args(NoiseReduction)
CUTOFF_HZ: dict[str, float] = {"near_field": 80.0, "far_field": 120.0}
# 36 dB an octave: at near_field's 80 Hz a 50 Hz hum is 24 dB down and 60 Hz 15 dB, a voice at 100 Hz 0.3 dB
_ORDER = 6


class HighPass:
    """The filter for one `kind` of noise reduction, stateful: call it on each chunk in order. Not thread-safe."""

    def __init__(self, kind: NoiseReduction, rate: int = SAMPLE_RATE) -> None:
        """Raises ValueError for an unknown kind."""
        from scipy.signal import butter  # type: ignore[import-untyped]  # imported when a session asks for it

        if kind not in CUTOFF_HZ:
            raise ValueError(f"noise reduction {kind!r} is not one of {', '.join(KINDS)}")
        self.kind = kind
        self._sos: Any = butter(_ORDER, CUTOFF_HZ[kind], btype="highpass", fs=rate, output="sos")
        self._zi: Any = np.zeros((self._sos.shape[0], 2))  # at rest: the audio before the first chunk is silence

    def __call__(self, pcm: np.ndarray) -> np.ndarray:
        """`pcm` (float32 mono) filtered, carrying on from the chunk before. Raises nothing."""
        if not len(pcm):
            return pcm
        from scipy.signal import sosfilt

        out, self._zi = sosfilt(self._sos, pcm, zi=self._zi)
        return np.asarray(out, np.float32)
