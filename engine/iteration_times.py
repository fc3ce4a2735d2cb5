"""Recent iterations' wall times by kind (decode only, mixed with a prompt chunk, prompt only) and the event
loop's gaps between them, as percentiles for /stats: what a stream's token gaps are made of under load. Each
kind also splits its engine-thread time: `engine` (the step itself) and `wait` (blocked reading the device's
results); wall minus engine is the hand-off between the event loop and the engine thread, engine minus wait
the host's own work (graph building, sampling, detokenization). Each step also names the one-off work it did
(`StepCost.events`: slot growth, rows adopted into slots, prefix-cache puts, a drained pipeline, a collection),
and /stats counts those names among the iterations slower than twice their kind's median: what a tail is made of."""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import AbstractSet, Any, Iterable, Mapping

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


class IterationTimes:
    """The last `window` samples of each kind. Event loop only."""

    def __init__(self, window: int = 2048) -> None:
        self._times: dict[str, deque[float]] = {k: deque(maxlen=window) for k in KINDS}
        self._engine: dict[str, deque[float]] = {k: deque(maxlen=window) for k in KINDS}
        self._wait: dict[str, deque[float]] = {k: deque(maxlen=window) for k in KINDS}
        self._events: dict[str, deque[AbstractSet[str]]] = {k: deque(maxlen=window) for k in KINDS}
        self._phases: dict[str, deque[Mapping[str, float]]] = {k: deque(maxlen=window) for k in KINDS}
        self._gaps: deque[float] = deque(maxlen=window)

    def record(self, cost: StepCost, seconds: float, gap: float | None) -> None:
        """One iteration: its engine step, its wall seconds on the event loop, and the event loop's time since
        the previous one ended (None after an idle pause). Raises nothing."""
        kind = "prefill" if not cost.decode_rows else "mixed" if cost.prompt_tokens else "decode"
        self._times[kind].append(seconds)
        self._engine[kind].append(cost.seconds)
        self._wait[kind].append(cost.wait_seconds)
        self._events[kind].append(cost.events)
        self._phases[kind].append(cost.phases)
        if gap is not None:
            self._gaps.append(gap)

    def snapshot(self) -> dict[str, Any]:
        """{kind: {n, p50_ms, p99_ms, max_ms, engine: {...}, wait: {...}, slow: {...}}} plus "gap" ({n, p50_ms,
        ...}). `slow`: how many iterations took over twice the kind's median, and how often each event occurred
        among them and among all. Raises nothing."""
        out: dict[str, Any] = {}
        for k, v in self._times.items():
            out[k] = ms_summary(v)
            if v:
                out[k] |= {"engine": ms_summary(self._engine[k]), "wait": ms_summary(self._wait[k]),
                           "slow": _slow(list(v), list(self._events[k]), list(self._phases[k]),
                                         2e-3 * out[k]["p50_ms"]),
                           "phases": _phases(self._phases[k])}
        out["gap"] = ms_summary(self._gaps)
        return out


def _phases(samples: Iterable[Mapping[str, float]]) -> dict[str, Any]:
    """{phase: {p50_ms, p99_ms, mean_ms}} over the steps, a step without the phase counting 0."""
    rows = list(samples)
    names = sorted({name for phases in rows for name in phases})
    out: dict[str, Any] = {}
    for name in names:
        summary = ms_summary(phases.get(name, 0.0) for phases in rows)
        out[name] = {"p50_ms": summary["p50_ms"], "p99_ms": summary["p99_ms"], "mean_ms": _mean_ms(rows, name)}
    return out


def _slow(times: list[float], events: list[AbstractSet[str]], phases: list[Mapping[str, float]],
          over: float) -> dict[str, Any]:
    """The iterations over `over` seconds: their events (and all iterations'), and their mean ms by phase."""
    slow = [i for i, t in enumerate(times) if t > over]
    slow_phases = [phases[i] for i in slow]
    names = sorted({name for p in slow_phases for name in p})
    return {"n": len(slow), "over_ms": round(over * 1e3, 3), "events": dict(Counter(x for i in slow for x in events[i])),
            "events_all": dict(Counter(x for e in events for x in e)),
            "phases_mean_ms": {name: _mean_ms(slow_phases, name) for name in names}}


def _mean_ms(steps: list[Mapping[str, float]], phase: str) -> float:
    """Mean ms of `phase` over `steps` (a step without it counts 0)."""
    return round(1e3 * sum(p.get(phase, 0.0) for p in steps) / len(steps), 3)


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
