"""What the CLI tests share: a small 16 kHz WAV on disk, and the configs a `tandem serve` would have served."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

__all__ = ["write_wav"]


def write_wav(path: Path, samples: np.ndarray) -> Path:
    """`samples` (floats in [-1, 1]) as a 16-bit mono 16 kHz WAV at `path`. Raises OSError."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((samples * 32767).astype("<i2").tobytes())
    return path


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[object]:
    """The configs service.server.serve is handed (it returns at once); port locks live under tmp_path."""
    import service.server

    configs: list[object] = []
    monkeypatch.setattr(service.server, "serve", lambda config: configs.append(config) or 0)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return configs
