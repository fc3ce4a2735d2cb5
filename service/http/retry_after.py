"""Retry-After for a 429 queue_full: about when the engine's queue has room again, from how long generation requests
took lately. A fixed 1 s let the SDKs (openai's and anthropic's retry twice, honouring Retry-After) spend their
retries in ~2 s while the queue took a minute to drain."""

from __future__ import annotations

import math
import statistics
from collections import deque

__all__ = ["RecentDurations", "queue_retry_after", "MAX_RETRY_AFTER"]

# The most a 429 asks a client to wait: the openai SDKs ignore a Retry-After over 60 s (and wait their own backoff).
MAX_RETRY_AFTER = 60


class RecentDurations:
    """Seconds the last `keep` generation requests took, arrival to last byte (the access log adds each answered
    one as it ends)."""

    def __init__(self, keep: int = 32) -> None:
        self._seconds: deque[float] = deque(maxlen=keep)

    def add(self, seconds: float) -> None:
        """Raises nothing."""
        if seconds >= 0:
            self._seconds.append(seconds)

    def typical(self) -> float | None:
        """Their median (a few very long or very short ones do not make it), None before any. Raises nothing."""
        return statistics.median(self._seconds) if self._seconds else None


def queue_retry_after(queued: int, max_active: int, durations: RecentDurations) -> int:
    """Whole seconds until the `queued` requests waiting now, and then one more, have started: each of `max_active`
    rows takes a typical request's duration, so (queued + 1) × duration / max_active; within 1..MAX_RETRY_AFTER, 1
    when no request has finished yet. A duration includes its own wait in the queue, so under a standing queue this
    errs long: better than retries spent before a place frees. Raises nothing."""
    typical = durations.typical()
    if typical is None or max_active <= 0:
        return 1
    return max(1, min(MAX_RETRY_AFTER, math.ceil((max(0, queued) + 1) * typical / max_active)))
