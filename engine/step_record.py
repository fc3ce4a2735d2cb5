"""What one engine step did, for /stats iteration_times: the one-off work it named (`events`: a prefix-cache put,
rows adopted into slots, a cache attached, slot growth, a compaction, a drained pipeline, rows changed, a garbage
collection, the prefill lane's phases it overlapped) and its seconds by part (`phases`). A slow iteration's events
say what it carried, not why it was slow. Its time is filed under the step whose tokens it delivered
(engine/step.py), so an iteration that read a decode step and launched a new row's first prompt chunk counts as
"decode", carrying that row's `attach`."""

from __future__ import annotations

import gc
import time
from typing import Any

__all__ = ["LANE_PHASES", "LanePhases", "StepRecord"]

LANE_PHASES = ("lane_build", "lane_launch", "lane_device")


class LanePhases:
    """Where the prefill lane's job is (building its graph, launching its kernels, waiting for the device), for the
    decode thread's step records: a step that overlapped a phase names it among its events, so /stats tells which
    of the lane's phases the slow decode steps shared the host or the device with. The lane thread writes, the
    decode thread reads (a str and ints, each read whole under the GIL); `seconds` sums each phase's time."""

    def __init__(self) -> None:
        self.current: str | None = None
        self.began = dict.fromkeys(LANE_PHASES, 0)
        self.seconds = dict.fromkeys(LANE_PHASES, 0.0)
        self.cpu_seconds = dict.fromkeys(LANE_PHASES, 0.0)  # the lane thread's CPU time in each: the rest waited
        self._since = self._cpu_since = 0.0

    def enter(self, phase: str | None) -> None:
        """The lane moves to `phase` (None: its job ended). Raises KeyError for an unknown phase."""
        now, cpu = time.perf_counter(), time.thread_time()
        if self.current is not None:
            self.seconds[self.current] += now - self._since
            self.cpu_seconds[self.current] += cpu - self._cpu_since
        if phase is not None:
            self.began[phase] += 1
        self.current, self._since, self._cpu_since = phase, now, cpu

    def mark(self) -> tuple[str | None, tuple[int, ...]]:
        """Where the lane is now, for `overlapped` at the step's end. Raises nothing."""
        return self.current, tuple(self.began.values())

    def overlapped(self, mark: tuple[str | None, tuple[int, ...]]) -> set[str]:
        """The phases the lane was in at some point since `mark`. Raises nothing."""
        current, began = mark
        seen = {p for p, before, now in zip(LANE_PHASES, began, self.began.values()) if now != before}
        return seen | ({current} if current is not None else set()) | ({self.current} if self.current else set())


class StepRecord:
    """The current step's events and phases (engine thread only). `begin` starts a step; `close` adds what is
    seen by comparing with its start and hands both over (the objects themselves: work after `close`, such as a
    prefix-cache reclaim, still counts for the same step)."""

    def __init__(self, lane: LanePhases | None = None) -> None:
        self.lane = lane  # the prefill lane's phases, where there is a lane (named in the step's events)
        self._lane_mark: tuple[str | None, tuple[int, ...]] | None = None
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
        self._lane_mark = self.lane.mark() if self.lane is not None else None

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
        if self.lane is not None and self._lane_mark is not None:
            self.events |= self.lane.overlapped(self._lane_mark)
        self.phases["read"] = waited
        return self.events, self.phases


def _collections() -> int:
    return sum(s["collections"] for s in gc.get_stats())
