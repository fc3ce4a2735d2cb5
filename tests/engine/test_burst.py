"""DecodeBursts (engine/burst.py) over a stand-in group: what ends a burst, without a model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.burst import DecodeBursts, StepResult, run_burst


@dataclass
class _Lane:
    jobs_done: int = 0
    jobs_landed: int = 0


@dataclass
class _Tasks:
    pending: bool = False

    def ran_within(self, seconds: float, besides: str) -> bool:
        return False


@dataclass
class _Host:
    lane: _Lane | None = field(default_factory=_Lane)
    tasks: Any = field(default_factory=_Tasks)
    counters: dict[str, float] = field(default_factory=lambda: {"bursts": 0, "burst_steps": 0})
    closed: bool = False

    def room_to_join(self) -> bool:
        return False

    def any_ended(self) -> bool:
        return False


def _steps(host: _Host, limit: int, during: Any = None) -> int:
    """Run one burst of up to `limit` steps planned from the loop's view of the lane; `during(i)` runs after step i.
    Returns the steps it ran."""
    bursts = DecodeBursts(host, limit)
    ran: list[int] = []

    def step() -> StepResult:
        ran.append(1)
        if during is not None:
            during(len(ran))
        return StepResult([], None, 0.001, 0.0, 1.0)

    def post(done: StepResult) -> None:
        done.published = True  # the loop keeps up: only the lane may end the burst

    planned = host.lane.jobs_landed if host.lane is not None else 0
    bursts.run([], step, post, planned)
    return len(ran)


def test_a_burst_runs_its_limit_when_nothing_waits() -> None:
    assert _steps(_Host(), 16) == 16


def test_a_lane_job_ending_mid_burst_ends_it_with_the_step_it_ended_during() -> None:
    host = _Host()

    def job_ends(i: int) -> None:
        if i == 5:
            assert host.lane is not None
            host.lane.jobs_done += 1

    assert _steps(host, 32, job_ends) == 5


def test_a_job_that_ended_but_had_not_landed_when_the_burst_was_planned_ends_it_at_once() -> None:
    # The lane thread counted the job, the loop had not yet taken its rows back: planned without them, the burst must
    # hand back after one step so that they join the next. (Counted from the burst's own start, it ran all 32.)
    host = _Host(lane=_Lane(jobs_done=3, jobs_landed=2))
    assert _steps(host, 32) == 1


def test_without_a_lane_only_the_limit_ends_a_burst() -> None:
    assert _steps(_Host(lane=None), 8) == 8


def test_run_burst_posts_every_step_but_the_last() -> None:
    posted: list[StepResult] = []
    results = iter(StepResult([], None, 0.5, 0.0, 1.0) for _ in range(3))
    last, n = run_burst(lambda: next(results), lambda posted_before: False, posted.append, 3)
    assert n == 3 and len(posted) == 2 and last not in posted and last.earlier == 1.0
