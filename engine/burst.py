"""Decode bursts: the engine thread runs decode steps back to back and hands each step's results to the event
loop as it goes, so publishing and HTTP writes overlap the model work instead of taking turns with it.
`DecodeBursts` decides when a burst may run and what ends one (anything that waits for the loop); engine/batch.py
asks it before a decode-only iteration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from engine.contracts import Delta
from engine.iteration_times import StepCost
from engine.lane import PrefillLane
from engine.rows import Row
from engine.tasks import ExecutionTasks

__all__ = ["BurstHost", "DecodeBursts", "StepResult", "run_burst", "PREFIX_PUT"]

PREFIX_PUT = "prefix-cache put"  # the group's own task; any other (a Whisper step) means the loop is shared


@dataclass
class StepResult:
    """One step's results for the event loop: deltas, the engine's cost and the tokens it counted."""

    outputs: list[tuple[Row, Delta]]
    cost: StepCost | None
    seconds: float  # wall time of the step (the event loop's view when it awaited it)
    prompted: float  # the group's counters are floats
    generated: float
    earlier: float = 0.0  # engine seconds of the burst's steps before this one
    published: bool = False  # set on the event loop once its deltas went out


def run_burst(step: Callable[[], StepResult], ends: Callable[[StepResult | None], bool],
              post: Callable[[StepResult], None], limit: int) -> tuple[StepResult, int]:
    """Engine thread: up to `limit` steps. After each, `ends(the step posted before, or None)` says whether
    something waits for the loop; if not, the step is `post`ed and the next one runs. Returns the last step
    (for the caller to land) and how many ran. Raises what a step raises (earlier ones are posted already)."""
    earlier = 0.0
    last: StepResult | None = None
    for i in range(limit):
        done = step()
        done.earlier = earlier
        if i == limit - 1 or ends(last):
            return done, i + 1
        post(done)
        last, earlier = done, earlier + done.seconds
    raise ValueError(f"a burst needs a limit >= 1, got {limit}")


class BurstHost(Protocol):
    """What a burst reads of its group (engine/batch.py LLMBatchGroup), between steps on the engine thread."""

    tasks: ExecutionTasks
    lane: PrefillLane | None
    counters: dict[str, float]

    @property
    def closed(self) -> bool: ...

    def room_to_join(self) -> bool:
        """A queued request has a free row to join (with every row busy only a finish frees one)."""
        ...

    def any_ended(self) -> bool:
        """An active row ended (its KV is freed between steps, cancelled ones too)."""
        ...


class DecodeBursts:
    """When a decode-only iteration may run as a burst, and what ends one. `limit`: steps per burst (1: none)."""

    def __init__(self, host: BurstHost, limit: int) -> None:
        self.host = host
        self.limit = limit
        # No bursts for this long after another subsystem's task ran (live speech): a burst keeps the engine
        # thread in Python, and a loop busy with audio then gets less GIL time (H200: chat p99 beside 4 live
        # sessions 19.2 ms with bursts, 15.0 ms without, one call).
        self.task_quiet_seconds = 1.0

    def may_run(self) -> bool:
        """Event loop: bursts are on and no other subsystem's task ran lately (the group's own puts do not count)."""
        return self.limit > 1 and not self.host.tasks.ran_within(self.task_quiet_seconds, besides=PREFIX_PUT)

    def run(self, rows: list[Row], step: Callable[[], StepResult], post: Callable[[StepResult], None],
            lane_jobs: int) -> StepResult:
        """Engine thread: `step`s back to back over `rows` until `end` says something waits, or one of its rows ended
        (a row whose last delta went out early may have left the group already, with a lane landing). `lane_jobs`:
        the lane's `jobs_landed` when the loop planned the burst."""
        jobs = lane_jobs
        done, steps = run_burst(step, lambda posted: bool(self.end(posted, jobs)) or any(r.ended for r in rows),
                                post, self.limit)
        self.host.counters["bursts"] += 1
        self.host.counters["burst_steps"] += steps
        return done

    def end(self, posted: StepResult | None, lane_jobs: int) -> str | None:
        """What waits for the loop, if anything: the group closes, a task (a Whisper step) or a request with room
        to join is queued, a row ended, the loop has not yet published the step posted before (it is busy: running
        further ahead would only batch tokens up and take its GIL time), or a lane job ended since the burst began
        (`lane_jobs`: the jobs landed when the burst was planned; one ended but not yet landed then ends it after its
        first step, and its rows join the next)."""
        host = self.host
        if host.closed:
            return "closed"
        if host.tasks.pending:
            return "task"
        if host.room_to_join():
            return "join"
        if host.any_ended():
            return "ended"
        if posted is not None and not posted.published:
            return "behind"
        return "lane" if host.lane is not None and host.lane.jobs_done != lane_jobs else None
