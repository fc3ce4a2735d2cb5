"""Decode bursts: the engine thread runs decode steps back to back and hands each step's results to the event
loop as it goes, so publishing and HTTP writes overlap the model work instead of taking turns with it.
engine/batch.py decides when a burst may run and what ends one (anything that waits for the loop)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from engine.contracts import Delta
from engine.iteration_times import StepCost
from engine.rows import Row

__all__ = ["StepResult", "run_burst"]


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
