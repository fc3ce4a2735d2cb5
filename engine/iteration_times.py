"""Recent iterations' wall times by kind (decode only, mixed with a prompt chunk, prompt only) and the event
loop's gaps between them, as percentiles for /stats: what a stream's token gaps are made of under load."""

from __future__ import annotations

from collections import deque
from typing import Any

from engine.percentiles import ms_summary

__all__ = ["IterationTimes"]

KINDS = ("decode", "mixed", "prefill")


class IterationTimes:
    """The last `window` samples of each kind. Event loop only."""

    def __init__(self, window: int = 2048) -> None:
        self._times: dict[str, deque[float]] = {k: deque(maxlen=window) for k in KINDS}
        self._gaps: deque[float] = deque(maxlen=window)

    def record(self, prompt_tokens: int, decode_rows: int, seconds: float, gap: float | None) -> None:
        """One iteration: its prompt tokens and decoding rows, its seconds, and the event loop's time since
        the previous one ended (None after an idle pause). Raises nothing."""
        kind = "prefill" if not decode_rows else "mixed" if prompt_tokens else "decode"
        self._times[kind].append(seconds)
        if gap is not None:
            self._gaps.append(gap)

    def snapshot(self) -> dict[str, Any]:
        """{kind: {n, p50_ms, p99_ms, max_ms}} plus "gap" the same way. Raises nothing."""
        out = {k: ms_summary(v) for k, v in self._times.items()}
        out["gap"] = ms_summary(self._gaps)
        return out
