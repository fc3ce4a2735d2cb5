"""Durations summarised for /stats: how many, p50, p99 and the longest, in milliseconds."""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

__all__ = ["ms_summary"]


def ms_summary(seconds: Iterable[float]) -> dict[str, Any]:
    """{"n", "p50_ms", "p99_ms", "max_ms"} of durations in seconds ({"n": 0} for none). Raises nothing."""
    ms = np.fromiter(seconds, float) * 1e3
    if not ms.size:
        return {"n": 0}
    p50, p99 = np.percentile(ms, [50, 99])
    return {"n": int(ms.size), "p50_ms": round(float(p50), 3), "p99_ms": round(float(p99), 3),
            "max_ms": round(float(ms.max()), 3)}
