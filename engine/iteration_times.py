"""Recent iterations' wall times by kind (decode only, mixed with a prompt chunk, prompt only) and the event
loop's gaps between them (idle time and waits for the prefill lane with nothing decoding are not gaps), as
percentiles for /stats: what a stream's token gaps are made of under load. Each
kind also splits its engine-thread time: `engine` (the step itself) and `wait` (blocked reading the device's
results); wall minus engine is the hand-off between the event loop and the engine thread, engine minus wait
the host's own work (graph building, sampling, detokenization). Each step also names the one-off work it did
(`StepCost.events`: slot growth, rows adopted into slots, prefix-cache puts, a drained pipeline, a collection),
and /stats counts those names among the iterations slower than twice their kind's median: what a tail is made of."""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import AbstractSet, Any, Mapping

import numpy as np

from engine.percentiles import ms_summary

__all__ = ["IterationTimes", "RecentRates", "StepCost"]

KINDS = ("decode", "mixed", "prefill")


@dataclass
class StepCost:
    """One engine step as the engine thread saw it: the iteration whose tokens it delivered."""

    seconds: float  # the step's own time on the engine thread
    prompt_tokens: int
    decode_rows: int
    wait_seconds: float = 0.0  # of which blocked on the device's results
    events: AbstractSet[str] = field(default_factory=frozenset)  # one-off work the step did (see module doc)
    phases: Mapping[str, float] = field(default_factory=dict)  # seconds by part of the step (engine/step.py)


class _Window:
    """One kind's last `size` iterations in preallocated columns (a ring: the order of samples does not matter to
    percentiles and means), each phase a column of its own, aligned with the rest."""

    def __init__(self, size: int) -> None:
        self.size, self.n, self.next = size, 0, 0
        self.times, self.engine, self.wait = np.zeros(size), np.zeros(size), np.zeros(size)
        self.events: list[AbstractSet[str]] = [frozenset()] * size
        self.phases: dict[str, np.ndarray] = {}  # a phase first seen late: the steps before it count 0

    def add(self, cost: StepCost, seconds: float) -> None:
        i = self.next
        self.times[i], self.engine[i], self.wait[i] = seconds, cost.seconds, cost.wait_seconds
        self.events[i] = cost.events
        for name in cost.phases.keys() - self.phases.keys():
            self.phases[name] = np.zeros(self.size)
        for name, column in self.phases.items():
            column[i] = cost.phases.get(name, 0.0)
        self.next, self.n = (i + 1) % self.size, min(self.n + 1, self.size)


class IterationTimes:
    """The last `window` samples of each kind, each measure (and each phase) a numpy column, so a /stats snapshot
    is a few reductions on the event loop rather than a walk over every step's record. Event loop only."""

    def __init__(self, window: int = 2048) -> None:
        self._kinds = {k: _Window(window) for k in KINDS}
        self._gaps: deque[float] = deque(maxlen=window)

    def record(self, cost: StepCost, seconds: float, gap: float | None) -> None:
        """One iteration: its engine step, its wall seconds on the event loop, and the event loop's time since
        the previous one ended (None after an idle pause). Raises nothing."""
        kind = "prefill" if not cost.decode_rows else "mixed" if cost.prompt_tokens else "decode"
        self._kinds[kind].add(cost, seconds)
        if gap is not None:
            self._gaps.append(gap)

    def snapshot(self) -> dict[str, Any]:
        """{kind: {n, p50_ms, p99_ms, max_ms, engine: {...}, wait: {...}, slow: {...}}} plus "gap" ({n, p50_ms,
        ...}). `slow`: how many iterations took over twice the kind's median, and how often each event occurred
        among them and among all. Raises nothing."""
        out: dict[str, Any] = {}
        for k, w in self._kinds.items():
            n = w.n
            out[k] = ms_summary(w.times[:n])
            if n:
                phases = {name: column[:n] for name, column in sorted(w.phases.items())}
                out[k] |= {"engine": ms_summary(w.engine[:n]), "wait": ms_summary(w.wait[:n]),
                           "slow": _slow(w.times[:n], w.events[:n], phases, 2e-3 * out[k]["p50_ms"]),
                           "phases": {name: _phase_summary(column) for name, column in phases.items()}}
        out["gap"] = ms_summary(self._gaps)
        return out


def _phase_summary(seconds: np.ndarray) -> dict[str, Any]:
    summary = ms_summary(seconds)
    return {"p50_ms": summary["p50_ms"], "p99_ms": summary["p99_ms"], "mean_ms": round(1e3 * float(seconds.mean()), 3)}


def _slow(times: np.ndarray, events: list[AbstractSet[str]], phases: dict[str, np.ndarray],
          over: float) -> dict[str, Any]:
    """The iterations over `over` seconds: their events (and all iterations'), and their mean ms by phase."""
    slow = np.flatnonzero(times > over)
    slow_events = [events[i] for i in slow]
    return {"n": int(slow.size), "over_ms": round(over * 1e3, 3),
            "events": dict(Counter(x for e in slow_events for x in e)),
            "events_all": dict(Counter(x for e in events if e for x in e)),
            "phases_mean_ms": {name: round(1e3 * float(column[slow].mean()), 3) for name, column in phases.items()
                               if slow.size and column[slow].any()}}


class RecentRates:
    """Wall-clock prompt and generation tokens/s over the last `window` seconds. Samples older than that are
    dropped as new ones arrive, so memory stays bounded whether or not anyone reads the rates. Event loop only."""

    def __init__(self, window: float = 10.0) -> None:
        self.window = window
        self._samples: deque[tuple[float, float, float]] = deque()  # (time, prompt tokens, generated tokens)

    def add(self, prompted: float, generated: float) -> None:
        """One iteration's tokens. Raises nothing."""
        now = time.monotonic()
        self._samples.append((now, prompted, generated))
        self._trim(now)

    def rates(self) -> tuple[float, float]:
        """(prompt, generation) tokens/s over the window. Raises nothing."""
        now = time.monotonic()
        self._trim(now)
        if not self._samples:
            return 0.0, 0.0
        span = max(now - self._samples[0][0], 1e-3)
        return (round(sum(p for _, p, _ in self._samples) / span, 2),
                round(sum(g for _, _, g in self._samples) / span, 2))

    def _trim(self, now: float) -> None:
        while self._samples and self._samples[0][0] < now - self.window:
            self._samples.popleft()
