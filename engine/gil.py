"""The GIL switch interval while serving: how long a thread that wants the GIL waits before it makes the holder let
go. The engine thread, the prefill lane, the speech thread and the event loop all share one GIL."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterator

__all__ = ["GIL_RETURN_SECONDS", "GIL_RETURN_VARIABLE", "GIL_SWITCH_SECONDS", "GIL_SWITCH_VARIABLE", "QuickReturn",
           "gil_return_seconds", "gil_switch_seconds"]

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


# While the decode thread launches a step (mx.async_eval frees the GIL), other threads' turns can be this short: a
# decode step beside the prefill lane waited 2.5 ms off its CPU on average to get the GIL back from a thread running
# Python, up to a whole switch interval (H200, bench/RESULTS.md, twenty-third session). Off unless asked for: not yet
# measured on a GPU. (Around the step's read as well, on this CPU chat beside 4 live sessions got worse, 3 rounds of
# 3: the read lasts the whole step there, and the speech thread and event loop swapped the GIL every 0.2 ms.)
GIL_RETURN_SECONDS = 0.0002
GIL_RETURN_VARIABLE = "TANDEM_GIL_RETURN"  # on | off (unset: off)


def gil_return_seconds() -> float | None:
    """The switch interval while the decode thread launches a step (GIL_RETURN_SECONDS) where TANDEM_GIL_RETURN is
    "on"; else None (off). Raises nothing."""
    return GIL_RETURN_SECONDS if os.environ.get(GIL_RETURN_VARIABLE, "off").lower() == "on" else None


class QuickReturn:
    """Around a call on the decode thread that frees the GIL: other threads' switch interval is `interval` while
    it runs, so this thread has the GIL back within about that much once the call returns (a thread that waits
    that long makes the holder let go), and the serving interval is back as soon as it does. One thread only:
    two threads saving and restoring the interval at once could leave it short. `interval` None: a no-op."""

    def __init__(self, interval: float | None) -> None:
        self.interval = interval

    @contextmanager
    def around(self) -> Iterator[None]:
        """Raises what the body raises (the interval restored first)."""
        if self.interval is None:
            yield
            return
        before = sys.getswitchinterval()
        sys.setswitchinterval(self.interval)
        try:
            yield
        finally:
            sys.setswitchinterval(before)
