"""Audio held in memory for live sessions: one growing buffer per stream, and one cap over all sessions."""

from __future__ import annotations

from typing import Any

import numpy as np

from audio.errors import AudioBufferFull, AudioLimitExceeded, SessionAudioLimit, SessionBacklogFull
from audio.pcm import SAMPLE_RATE

# The limit errors are defined in audio/errors.py and re-exported here, where the caps are.
__all__ = ["AudioBuffer", "AudioPool", "AudioLimitExceeded", "SessionAudioLimit", "AudioBufferFull",
           "SessionBacklogFull"]


class AudioBuffer:
    """Growing 16 kHz signal addressed by absolute sample index; the consumed prefix can be dropped."""

    def __init__(self) -> None:
        self._data = np.zeros(SAMPLE_RATE * 8, np.float32)
        self._len = 0
        self.base = 0  # absolute index of _data[0]

    @property
    def total(self) -> int:
        return self.base + self._len

    @property
    def held(self) -> int:
        """Samples in memory. Raises nothing."""
        return self._len

    def append(self, x: np.ndarray) -> None:
        """Add samples at the end. Raises nothing."""
        need = self._len + len(x)
        if need > len(self._data):
            grown = np.zeros(max(need, 2 * len(self._data)), np.float32)
            grown[: self._len] = self._data[: self._len]
            self._data = grown
        self._data[self._len:need] = x
        self._len = need

    def view(self, start: int, count: int) -> np.ndarray:
        """A copy of samples [start, start+count) (absolute), clipped to what exists. Raises nothing."""
        a = max(0, start - self.base)
        return self._data[a: min(self._len, max(a, start - self.base + count))].copy()

    def truncate(self, end: int) -> None:
        """Forget samples from absolute index `end` on (never before what was already discarded). Raises nothing."""
        self._len = max(0, min(self._len, end - self.base))

    def discard_before(self, start: int) -> None:
        """Forget samples before absolute index `start`; a large buffer left mostly empty shrinks. Raises nothing."""
        cut = min(self._len, max(0, start - self.base))
        if cut:
            self._data[: self._len - cut] = self._data[cut: self._len]
            self._len -= cut
            self.base += cut
        if len(self._data) > 4 * max(self._len, SAMPLE_RATE * 8):
            self._data = self._data[: max(2 * self._len, SAMPLE_RATE * 8)].copy()


class AudioPool:
    """Audio held by all live sessions against one cap (`max_seconds`; None: no cap)."""

    def __init__(self, max_seconds: float | None) -> None:
        self.max_samples = None if max_seconds is None else int(max_seconds * SAMPLE_RATE)
        self._held: dict[int, int] = {}
        self.total = 0

    def admit(self, owner: Any, samples: int) -> None:
        """Raises AudioBufferFull (an AudioLimitExceeded) when `samples` more would pass the cap."""
        if self.max_samples is not None and self.total + samples > self.max_samples:
            raise AudioBufferFull(
                f"the server holds {self.total / SAMPLE_RATE:.0f} s of untranscribed session audio (limit "
                f"{self.max_samples / SAMPLE_RATE:.0f} s); retry when sessions have caught up")

    def update(self, owner: Any) -> None:
        """Record what `owner` holds now (its `held_samples`). Raises nothing."""
        held = int(owner.held_samples)
        self.total += held - self._held.get(id(owner), 0)
        self._held[id(owner)] = held

    def forget(self, owner: Any) -> None:
        """`owner` holds nothing any more. Raises nothing."""
        self.total -= self._held.pop(id(owner), 0)
