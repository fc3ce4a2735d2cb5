"""service/process/supervisor.py: the main process's signal handlers never wait on a lock their own thread holds."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from service.process.supervisor import SupervisedGranian, wake


def _handler_inside_set(event: threading.Event, handler: object) -> threading.Thread:
    """On a thread of its own: hold the event's lock, as Event.set does when a second signal interrupts it, and
    run the handler there. Returns the thread (a deadlocked one never ends; it is a daemon)."""
    def run() -> None:
        with event._cond:  # type: ignore[attr-defined]
            handler()  # type: ignore[operator]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_signal_arriving_while_the_event_lock_is_held_does_not_deadlock() -> None:
    # `pkill -f "tandem serve"` under `uv run` delivers SIGTERM twice; the second arrived inside the first
    # handler's Event.set and the main process hung in Condition.__enter__ with the port held.
    server = object.__new__(SupervisedGranian)
    server.main_loop_interrupt = threading.Event()
    server.interrupt_signal = server.reload_signal = False
    thread = _handler_inside_set(server.main_loop_interrupt, server.signal_handler_interrupt)
    thread.join(30)
    assert not thread.is_alive(), "the handler waited for a lock its own thread holds"
    assert server.interrupt_signal and server.main_loop_interrupt.wait(30)


def test_wake_sets_the_event_at_once_when_the_lock_is_free() -> None:
    event = threading.Event()
    wake(event)
    assert event.is_set()
    server = object.__new__(SupervisedGranian)
    server.main_loop_interrupt, server.reload_signal = threading.Event(), False
    thread = _handler_inside_set(server.main_loop_interrupt, server.signal_handler_reload)
    thread.join(30)
    assert not thread.is_alive() and server.reload_signal and server.main_loop_interrupt.wait(30)


class _Worker:
    def __init__(self) -> None:
        self.killed = 0
        self.idx = 0
        self.inner = type("Process", (), {"pid": 4242})()

    def kill(self) -> None:
        self.killed += 1

    def is_alive(self) -> bool:
        return self.killed == 0


class _Timer:
    """threading.Timer, run by the test instead of a clock."""

    made: list["_Timer"] = []

    def __init__(self, interval: float, function: Any) -> None:
        self.interval, self.function, self.started, self.daemon = interval, function, False, False
        _Timer.made.append(self)

    def start(self) -> None:
        self.started = True


def _server_at(clock: list[float], monkeypatch: pytest.MonkeyPatch) -> tuple[SupervisedGranian, _Worker]:
    import service.process.supervisor as supervisor

    monkeypatch.setattr(supervisor.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(supervisor.threading, "Timer", _Timer)
    monkeypatch.setattr(_Timer, "made", [])
    server = object.__new__(SupervisedGranian)
    server.main_loop_interrupt = threading.Event()
    server.interrupt_signal = server.reload_signal = False
    worker = _Worker()
    server.wrks = [worker]  # type: ignore[list-item]
    return server, worker


def test_a_second_interrupt_ends_the_streams_then_kills_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    # With --shutdown-timeout 30, Ctrl-C twice still waited the whole drain: the second one must end it. It killed the
    # worker at once: open streams were cut with no error event and no [DONE], and the process exited 0.
    import service.process.supervisor as supervisor
    from service.process.drain import HURRY_SIGNAL

    signalled: list[tuple[int, int]] = []
    monkeypatch.setattr(supervisor.os, "kill", lambda pid, sig: signalled.append((pid, sig)))
    clock = [100.0]
    server, worker = _server_at(clock, monkeypatch)
    server.signal_handler_interrupt()
    assert worker.killed == 0 and server.interrupt_signal and not signalled  # the first drains
    assert server.signal_exit_code([0]) is None  # a drained server exits 0
    clock[0] += 1.0
    server.signal_handler_interrupt()
    assert signalled == [(4242, HURRY_SIGNAL)] and worker.killed == 0  # the worker ends its streams itself
    (timer,) = _Timer.made
    assert timer.started and timer.daemon and timer.interval == supervisor.FORCED_STOP_SECONDS
    timer.function()  # it has not gone meanwhile
    assert worker.killed == 1
    assert server.signal_exit_code([-9]) == supervisor.EXIT_FORCED_STOP == 1


def test_a_third_interrupt_kills_the_worker_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import service.process.supervisor as supervisor

    monkeypatch.setattr(supervisor.os, "kill", lambda pid, sig: None)
    clock = [100.0]
    server, worker = _server_at(clock, monkeypatch)
    for _ in range(2):
        server.signal_handler_interrupt()
        clock[0] += 1.0
    assert worker.killed == 0
    server.signal_handler_interrupt()
    assert worker.killed == 1


def test_a_signal_delivered_twice_at_once_still_drains(monkeypatch: pytest.MonkeyPatch) -> None:
    # `uv run` forwards the SIGTERM pkill also sent: the pair is one request to stop, not two.
    clock = [100.0]
    server, worker = _server_at(clock, monkeypatch)
    server.signal_handler_interrupt()
    clock[0] += 0.01
    server.signal_handler_interrupt()
    assert worker.killed == 0


@pytest.mark.parametrize("signum, codes, exits", [(2, [5], 130), (15, [5], 143), (2, [0], None), (2, [-9], None),
                                                   (None, [5], None)])
def test_a_signal_that_stopped_a_worker_still_loading_is_the_exit_code(signum: int | None, codes: list[int],
                                                                       exits: int | None) -> None:
    # Ctrl-C during a first start's conversion exited 0 (a few seconds earlier, before the worker: 130); a drained
    # server still exits 0 (granian's code).
    server = object.__new__(SupervisedGranian)
    server.interrupted_by = signum
    assert server.signal_exit_code(codes) == exits


def test_the_signal_handler_remembers_the_first_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    server = object.__new__(SupervisedGranian)
    server.main_loop_interrupt = threading.Event()
    server.interrupt_signal = False
    server.signal_handler_interrupt(signal.SIGINT, None)
    server.signal_handler_interrupt(signal.SIGTERM, None)  # within FORCE_AFTER_SECONDS: the same request
    assert server.interrupted_by == signal.SIGINT
