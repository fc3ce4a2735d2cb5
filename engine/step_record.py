"""What one engine step did, for /stats iteration_times: the one-off work it named (`events`: a prefix-cache put,
rows adopted into slots, a cache attached, slot growth, a compaction, a drained pipeline, rows changed, a garbage
collection) and its seconds by part (`phases`). A slow iteration's events say what it carried, not why it was
slow. Its time is filed under the step whose tokens it delivered (engine/step.py), so an iteration that read a
decode step and launched a new row's first prompt chunk counts as "decode", carrying that row's `attach`."""

from __future__ import annotations

import gc
import time
from typing import Any

__all__ = ["StepRecord"]


class StepRecord:
    """The current step's events and phases (engine thread only). `begin` starts a step; `close` adds what is
    seen by comparing with its start and hands both over (the objects themselves: work after `close`, such as a
    prefix-cache reclaim, still counts for the same step)."""

    def __init__(self) -> None:
        self.events: set[str] = set()
        self.phases: dict[str, float] = {}
        self._shape: tuple[int, int] = (0, 0)  # the slot buffers' (slots, capacity) as the step began
        self._collections = 0
        self._decode_rows = 0  # the previous step's
        self.counts: tuple[int, int] = (0, 0)  # the step's (prompt, generated) tokens, as the group counted them

    def begin(self, slots: Any) -> None:
        """A new step over `slots` (the runner's SlotKV, or None). Raises nothing."""
        self.events, self.phases = set(), {}
        self._shape = (slots.slots, slots.capacity) if slots is not None else (0, 0)
        self._collections = _collections()

    def note(self, event: str) -> None:
        self.events.add(event)

    def tick(self, phase: str, since: float) -> float:
        """Add the seconds since `since` to `phase`; returns now. Raises nothing."""
        now = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - since
        return now

    def close(self, decode_rows: int, slots: Any, waited: float) -> tuple[set[str], dict[str, float]]:
        """The step's events (rows changed, slots grown, a collection ran: found by comparison) and phases (with
        `read`, its wait for the device). Raises nothing."""
        if decode_rows != self._decode_rows:
            self.events.add("rows")
        self._decode_rows = decode_rows
        if slots is not None and (slots.slots, slots.capacity) > self._shape:
            self.events.add("grow")
        if _collections() != self._collections:
            self.events.add("gc")
        self.phases["read"] = waited
        return self.events, self.phases


def _collections() -> int:
    return sum(s["collections"] for s in gc.get_stats())
