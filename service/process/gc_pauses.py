"""Python's garbage collector as a source of pauses. A collection holds the GIL, so it stops the engine thread
and the event loop together: every stream waits. What startup built (models, modules, the app) never dies, yet
each full collection walked it again (70–90 ms on this CPU while serving). At ready it is frozen out of
collections (`gc.freeze`), and pauses are counted by generation for /stats and /metrics. The frozen count is the one
taken at the freeze: `gc.get_freeze_count()` walks every frozen object under the GIL (20-40 ms for the ~500,000 a
served model leaves), which made each /stats or /metrics request a pause for every stream."""

from __future__ import annotations

import gc
import time
from collections import deque
from typing import Any

__all__ = ["GcPauses", "GC_PAUSES", "freeze_startup", "ready_for_serving"]


class GcPauses:
    """Collections and their pauses by generation, from `gc.callbacks` (installed once per process)."""

    def __init__(self, recent: int = 256) -> None:
        self.counts = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]
        self.recent: deque[float] = deque(maxlen=recent)  # the last full collections' pauses
        self._began = 0.0
        self._installed = False
        self.frozen = 0  # objects moved out of collections at ready (counted then, never walked again)

    def install(self) -> None:
        """Start counting. Idempotent. Raises nothing."""
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        # Collections run one at a time under the GIL, so one start time suffices.
        if phase == "start":
            self._began = time.perf_counter()
            return
        gen = min(int(info.get("generation", 0)), 2)
        took = time.perf_counter() - self._began
        self.counts[gen] += 1
        self.seconds[gen] += took
        self.longest[gen] = max(self.longest[gen], took)
        if gen == 2:
            self.recent.append(took)

    def snapshot(self) -> dict[str, Any]:
        """Counts, total and longest pause (ms) by generation, the frozen object count. Raises nothing."""
        return {
            "frozen_objects": self.frozen,
            "thresholds": list(gc.get_threshold()),
            "generations": [
                {"collections": self.counts[g], "pause_ms_total": round(self.seconds[g] * 1e3, 3),
                 "pause_ms_max": round(self.longest[g] * 1e3, 3)} for g in range(3)
            ],
            "recent_full_pause_ms_max": round(max(self.recent, default=0.0) * 1e3, 3),
        }


GC_PAUSES = GcPauses()  # one per process: gc.callbacks is process-wide


def freeze_startup() -> int:
    """Collect once, then move every object alive now out of future collections. Returns the frozen object
    count. Raises nothing."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def ready_for_serving(freeze: bool, thresholds: tuple[int, int, int] | None) -> int:
    """At ready: freeze startup's objects when asked, set the collection thresholds when given, then count
    serving's pauses. Returns the frozen object count (0: not frozen). Raises nothing."""
    frozen = freeze_startup() if freeze else 0
    GC_PAUSES.frozen = frozen
    if thresholds is not None:
        gc.set_threshold(*thresholds)
    GC_PAUSES.install()  # after the freeze's own collection: /stats counts serving's
    return frozen
