"""engine/iteration_times.py: iterations are told apart by what they carried; percentiles of recent ones."""

from __future__ import annotations

from engine.iteration_times import IterationTimes, StepCost


def test_kinds_percentiles_and_gaps() -> None:
    times = IterationTimes(window=200)
    for i in range(100):
        times.record(StepCost(0.003, 0, 8, 0.002), 0.004 + (0.02 if i == 99 else 0.0), 0.001)
    times.record(StepCost(0.010, 512, 8, 0.006), 0.012, None)  # after an idle pause: no gap sample
    times.record(StepCost(0.003, 64, 0), 0.003, 0.002)
    snap = times.snapshot()
    assert snap["decode"]["n"] == 100 and snap["decode"]["p50_ms"] == 4.0 and snap["decode"]["max_ms"] == 24.0
    assert snap["decode"]["engine"]["p50_ms"] == 3.0 and snap["decode"]["wait"]["max_ms"] == 2.0
    assert snap["mixed"] == {"n": 1, "p50_ms": 12.0, "p99_ms": 12.0, "max_ms": 12.0,
                             "engine": {"n": 1, "p50_ms": 10.0, "p99_ms": 10.0, "max_ms": 10.0},
                             "wait": {"n": 1, "p50_ms": 6.0, "p99_ms": 6.0, "max_ms": 6.0},
                             "slow": {"n": 0, "over_ms": 24.0, "events": {}, "events_all": {},
                                      "phases_mean_ms": {}}, "phases": {}}
    assert snap["prefill"]["n"] == 1 and snap["gap"]["n"] == 101


def test_slow_iterations_name_what_they_did() -> None:
    times = IterationTimes()
    for i in range(50):  # every tenth step grew the slots; two of those and one plain step were slow
        events = frozenset({"grow", "put"}) if i % 10 == 0 else frozenset({"put"}) if i % 2 else frozenset()
        slow = i in (0, 10, 7)
        phases = {"launch": 0.006 if slow else 0.001, "accept": 0.001}
        times.record(StepCost(0.003, 0, 8, events=events, phases=phases), 0.010 if slow else 0.004, None)
    slow = times.snapshot()["decode"]["slow"]
    assert slow["n"] == 3 and slow["over_ms"] == 8.0
    assert slow["events"] == {"grow": 2, "put": 3}
    assert slow["events_all"] == {"grow": 5, "put": 30}
    assert slow["phases_mean_ms"] == {"accept": 1.0, "launch": 6.0}  # where the slow ones' time went


def test_phases_split_a_kinds_engine_time() -> None:
    times = IterationTimes()
    for i in range(10):  # one step in ten puts; the rest never do (counted as 0)
        phases = {"forward": 0.002, "accept": 0.001} | ({"put": 0.010} if i == 0 else {})
        times.record(StepCost(0.003, 0, 8, phases=phases), 0.004, None)
    phases = times.snapshot()["decode"]["phases"]
    assert phases["forward"] == {"p50_ms": 2.0, "p99_ms": 2.0, "mean_ms": 2.0}
    assert phases["put"]["p50_ms"] == 0.0 and phases["put"]["mean_ms"] == 1.0


def test_the_window_keeps_the_latest() -> None:
    times = IterationTimes(window=3)
    for s in (1.0, 0.001, 0.001, 0.001):
        times.record(StepCost(s, 0, 1), s, None)
    assert times.snapshot()["decode"]["max_ms"] == 1.0 and times.snapshot()["gap"] == {"n": 0}


def test_recent_rates_keep_only_the_window_even_when_never_read(monkeypatch) -> None:
    import engine.iteration_times as it

    clock = [0.0]
    monkeypatch.setattr(it.time, "monotonic", lambda: clock[0])
    rates = it.RecentRates(window=10.0)
    for _ in range(10_000):  # 1,000 s of iterations at 10 a second, nobody polling /stats
        clock[0] += 0.1
        rates.add(prompted=5, generated=2)
    assert len(rates._samples) <= 101  # bounded by the window, not by the uptime
    prompt, generated = rates.rates()
    assert abs(prompt - 50) < 1 and abs(generated - 20) < 1
