"""engine/percentiles.py: durations in seconds summarised in milliseconds."""

from __future__ import annotations

from engine.percentiles import ms_summary


def test_counts_percentiles_and_the_longest() -> None:
    s = ms_summary([0.001] * 99 + [0.5])
    assert s["n"] == 100 and s["p50_ms"] == 1.0 and s["max_ms"] == 500.0 and 1.0 < s["p99_ms"] < 500.0


def test_nothing_to_summarise() -> None:
    assert ms_summary([]) == {"n": 0} and ms_summary(iter(())) == {"n": 0}
