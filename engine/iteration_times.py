"""Recent iterations' wall times by kind (decode only, mixed with a prompt chunk, prompt only) and the event
loop's gaps between them, as percentiles for /stats: what a stream's token gaps are made of under load. Each
kind also splits its engine-thread time: `engine` (the step itself) and `wait` (blocked reading the device's
results); wall minus engine is the hand-off between the event loop and the engine thread, engine minus wait
the host's own work (graph building, sampling, detokenization)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from engine.percentiles import ms_summary

__all__ = ["IterationTimes", "StepCost"]

KINDS = ("decode", "mixed", "prefill")


@dataclass
class StepCost:
    """One engine step as the engine thread saw it: the iteration whose tokens it delivered."""

    seconds: float  # the step's own time on the engine thread
    prompt_tokens: int
    decode_rows: int
    wait_seconds: float = 0.0  # of which blocked on the device's results


class IterationTimes:
    """The last `window` samples of each kind. Event loop only."""

    def __init__(self, window: int = 2048) -> None:
        self._times: dict[str, deque[float]] = {k: deque(maxlen=window) for k in KINDS}
        self._engine: dict[str, deque[float]] = {k: deque(maxlen=window) for k in KINDS}
        self._wait: dict[str, deque[float]] = {k: deque(maxlen=window) for k in KINDS}
        self._gaps: deque[float] = deque(maxlen=window)

    def record(self, cost: StepCost, seconds: float, gap: float | None) -> None:
        """One iteration: its engine step, its wall seconds on the event loop, and the event loop's time since
        the previous one ended (None after an idle pause). Raises nothing."""
        kind = "prefill" if not cost.decode_rows else "mixed" if cost.prompt_tokens else "decode"
        self._times[kind].append(seconds)
        self._engine[kind].append(cost.seconds)
        self._wait[kind].append(cost.wait_seconds)
        if gap is not None:
            self._gaps.append(gap)

    def snapshot(self) -> dict[str, Any]:
        """{kind: {n, p50_ms, p99_ms, max_ms, engine: {...}, wait: {...}}} plus "gap" ({n, p50_ms, ...}).
        Raises nothing."""
        out: dict[str, Any] = {}
        for k, v in self._times.items():
            out[k] = ms_summary(v)
            if v:
                out[k] |= {"engine": ms_summary(self._engine[k]), "wait": ms_summary(self._wait[k])}
        out["gap"] = ms_summary(self._gaps)
        return out
