"""What the CLI tests share: a small 16 kHz WAV on disk."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

__all__ = ["write_wav"]


def write_wav(path: Path, samples: np.ndarray) -> Path:
    """`samples` (floats in [-1, 1]) as a 16-bit mono 16 kHz WAV at `path`. Raises OSError."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((samples * 32767).astype("<i2").tobytes())
    return path
