"""Timeline — speech-only audio and where each piece came from.

With VAD on, Whisper sees only the speech pieces, concatenated (faster-whisper's vad_filter does the same):
silence never costs an encoder pass and never becomes " . . .". Times Whisper reports on the compact signal
are mapped back to the original audio here.
"""

from __future__ import annotations

import bisect

import numpy as np

from audio.pcm import SAMPLE_RATE

__all__ = ["Timeline", "compact"]


class Timeline:
    """Pieces (compact start, source start, length) in samples, in order, never overlapping."""

    def __init__(self) -> None:
        self._compact: list[int] = []
        self._source: list[int] = []
        self._length: list[int] = []

    @property
    def length(self) -> int:
        """Compact samples so far. Raises nothing."""
        return self._compact[-1] + self._length[-1] if self._compact else 0

    def add(self, source_start: int, length: int) -> None:
        """Append `length` source samples from `source_start` (after every earlier piece). Raises ValueError
        for a piece that goes back in time."""
        if length <= 0:
            return
        if self._compact:
            last_end = self._source[-1] + self._length[-1]
            if source_start < last_end:
                raise ValueError("timeline pieces must move forward")
            if source_start == last_end:
                self._length[-1] += length
                return
        self._compact.append(self.length)
        self._source.append(source_start)
        self._length.append(length)

    def truncate(self, length: int) -> None:
        """Forget compact samples from `length` on (pieces after it go, the piece across it is cut).
        Raises nothing."""
        while self._compact and self._compact[-1] >= length:
            self._compact.pop()
            self._source.pop()
            self._length.pop()
        if self._compact:
            self._length[-1] = min(self._length[-1], length - self._compact[-1])

    def to_source(self, sample: float, *, end: bool = False) -> float:
        """Source sample of a compact position. A boundary between pieces maps to the later piece's start, or
        with `end` to the earlier piece's end; positions past the last piece stick to its end. Raises nothing."""
        if not self._compact:
            return sample
        find = bisect.bisect_left if end else bisect.bisect_right
        i = max(0, find(self._compact, sample) - 1)
        offset = min(max(0.0, sample - self._compact[i]), self._length[i])
        return self._source[i] + offset

    def span(self, start: float, end: float, grace: float) -> tuple[float, float]:
        """Source samples of the compact span [start, end]. A span reaching less than `grace` samples into the
        first or the last piece it crosses is kept out of that piece: Whisper's segment times run a few tenths of
        a second past a cut, and mapped as they are, a sentence's end lands in the next speech, however far
        away. Raises nothing."""
        if not self._compact or end <= start:
            return self.to_source(start), self.to_source(end, end=True)
        lo = max(0, bisect.bisect_right(self._compact, start) - 1)
        hi = max(0, bisect.bisect_left(self._compact, end) - 1)
        if hi > lo:
            tail, head = end - self._compact[hi], self._compact[lo] + self._length[lo] - start
            both = tail < grace and head < grace and hi == lo + 1  # keep the piece it reaches further into
            if tail < grace and not (both and tail > head):
                hi -= 1
            if head < grace and hi > lo:
                lo += 1
        a = min(max(start, self._compact[lo]), self._compact[lo] + self._length[lo])
        b = min(max(end, self._compact[hi]), self._compact[hi] + self._length[hi])
        return self._source[lo] + a - self._compact[lo], self._source[hi] + b - self._compact[hi]

    def next_break(self, sample: float, gap: float) -> int | None:
        """The compact start of the first piece after `sample` that follows a removed silence of at least `gap`
        source samples, or None. Raises nothing."""
        for j in range(max(1, bisect.bisect_right(self._compact, sample)), len(self._compact)):
            if self._source[j] - (self._source[j - 1] + self._length[j - 1]) >= gap:
                return self._compact[j]
        return None

    def seconds(self, t: float, *, end: bool = False) -> float:
        """to_source in seconds. Raises nothing."""
        return self.to_source(t * SAMPLE_RATE, end=end) / SAMPLE_RATE


def compact(pcm: np.ndarray, pieces: list[tuple[int, int]]) -> tuple[np.ndarray, Timeline]:
    """The pieces of `pcm` concatenated, and their Timeline. Raises ValueError for pieces out of order."""
    timeline = Timeline()
    for a, b in pieces:
        timeline.add(a, b - a)
    if not pieces:
        return pcm[:0], timeline
    return np.concatenate([pcm[a:b] for a, b in pieces]).astype(np.float32, copy=False), timeline
