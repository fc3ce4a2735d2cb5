"""When the supervisor respawns a dead worker and when it gives up."""

from __future__ import annotations

from service.process.restarts import EXIT_STARTUP_FAILED, RestartPolicy


def test_a_worker_that_could_not_start_is_not_respawned() -> None:
    decision = RestartPolicy().decide(EXIT_STARTUP_FAILED, now=0.0)
    assert not decision.respawn and "could not start" in decision.reason


def test_a_killed_worker_is_respawned_at_once_then_with_growing_delays() -> None:
    policy = RestartPolicy(max_restarts=4, window=60.0)
    delays = [policy.decide(-9, now=float(t)) for t in range(4)]
    assert all(d.respawn for d in delays) and [d.delay for d in delays] == [0.0, 0.5, 1.0, 2.0]
    assert "signal 9" in delays[0].reason
    crash_loop = policy.decide(-9, now=4.0)
    assert not crash_loop.respawn and "within 60 s" in crash_loop.reason


def test_deaths_far_apart_never_add_up_to_a_crash_loop() -> None:
    policy = RestartPolicy(max_restarts=2, window=10.0)
    assert all(policy.decide(137, now=t * 11.0).respawn for t in range(10))
