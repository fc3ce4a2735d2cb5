"""engine/percentiles.py: /stats summaries equal numpy's linear percentiles, from arrays and from iterables."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.percentiles import ms_summary


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=10.0, allow_nan=False), min_size=1, max_size=300))
def test_summary_equals_numpys_percentiles(seconds: list[float]) -> None:
    p50, p99 = np.percentile(np.array(seconds) * 1e3, [50, 99])
    for given_as in (seconds, np.array(seconds), iter(seconds)):
        summary = ms_summary(given_as)
        assert summary["n"] == len(seconds) and summary["max_ms"] == round(max(seconds) * 1e3, 3)
        assert abs(summary["p50_ms"] - p50) <= 1e-3 + 1e-9 * p50 and abs(summary["p99_ms"] - p99) <= 1e-3 + 1e-9 * p99


def test_counts_percentiles_and_the_longest() -> None:
    s = ms_summary([0.001] * 99 + [0.5])
    assert s["n"] == 100 and s["p50_ms"] == 1.0 and s["max_ms"] == 500.0 and 1.0 < s["p99_ms"] < 500.0


def test_nothing_to_summarise() -> None:
    assert ms_summary([]) == {"n": 0} and ms_summary(iter(())) == {"n": 0} and ms_summary(np.array([])) == {"n": 0}
