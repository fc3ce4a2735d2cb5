"""Durations summarised for /stats: how many, p50, p99 and the longest, in milliseconds."""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

__all__ = ["ms_summary"]


def ms_summary(seconds: Iterable[float] | np.ndarray) -> dict[str, Any]:
    """{"n", "p50_ms", "p99_ms", "max_ms"} of durations in seconds ({"n": 0} for none), percentiles interpolated
    linearly as numpy's default. One sort, not `np.percentile` (whose overhead was most of a /stats request, which
    runs on the event loop). Raises nothing."""
    ms = np.sort(seconds if isinstance(seconds, np.ndarray) else np.fromiter(seconds, float)) * 1e3
    if not ms.size:
        return {"n": 0}
    return {"n": int(ms.size), "p50_ms": round(_at(ms, 0.5), 3), "p99_ms": round(_at(ms, 0.99), 3),
            "max_ms": round(float(ms[-1]), 3)}


def _at(ordered: np.ndarray, q: float) -> float:
    position = q * (ordered.size - 1)
    low = int(position)
    high = min(low + 1, ordered.size - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (position - low))
