"""The GIL switch interval while serving: how long a thread that wants the GIL waits before it makes the holder let
go. The engine thread, the prefill lane, the speech thread and the event loop all share one GIL."""

from __future__ import annotations

import os

__all__ = ["GIL_SWITCH_SECONDS", "GIL_SWITCH_VARIABLE", "gil_switch_seconds"]

# The GIL switch interval while serving (Python's own default). 0.5 ms made the event loop take the GIL from the
# engine thread in the middle of building each step: on the H200, 14 % of its time over HTTP went waiting for the
# GIL (1 % with no HTTP), and 64 streams gave 5,737 tok/s against 7,103 at 5 ms (bench/RESULTS.md).
GIL_SWITCH_SECONDS = 0.005
GIL_SWITCH_VARIABLE = "TANDEM_GIL_SWITCH_MS"


def gil_switch_seconds() -> float:
    """The GIL switch interval to serve with: TANDEM_GIL_SWITCH_MS (milliseconds) or GIL_SWITCH_SECONDS.
    Raises ValueError naming the variable for a value that is not a positive number."""
    raw = os.environ.get(GIL_SWITCH_VARIABLE)
    if raw is None:
        return GIL_SWITCH_SECONDS
    try:
        ms = float(raw)
    except ValueError:
        ms = float("nan")
    if not 0 < ms < 1e6:
        raise ValueError(f"{GIL_SWITCH_VARIABLE} must be a positive number of milliseconds, not {raw!r}")
    return ms / 1e3
