"""engine/iteration_times.py: iterations are told apart by what they carried; percentiles of recent ones."""

from __future__ import annotations

from engine.iteration_times import IterationTimes


def test_kinds_percentiles_and_gaps() -> None:
    times = IterationTimes(window=200)
    for i in range(100):
        times.record(0, 8, 0.004 + (0.02 if i == 99 else 0.0), 0.001)
    times.record(512, 8, 0.012, None)  # after an idle pause: no gap sample
    times.record(64, 0, 0.003, 0.002)
    snap = times.snapshot()
    assert snap["decode"]["n"] == 100 and snap["decode"]["p50_ms"] == 4.0 and snap["decode"]["max_ms"] == 24.0
    assert snap["mixed"] == {"n": 1, "p50_ms": 12.0, "p99_ms": 12.0, "max_ms": 12.0}
    assert snap["prefill"]["n"] == 1 and snap["gap"]["n"] == 101


def test_the_window_keeps_the_latest() -> None:
    times = IterationTimes(window=3)
    for s in (1.0, 0.001, 0.001, 0.001):
        times.record(0, 1, s, None)
    assert times.snapshot()["decode"]["max_ms"] == 1.0 and times.snapshot()["gap"] == {"n": 0}
