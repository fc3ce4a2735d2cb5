"""granian's main process as the supervisor of the one worker: it owns the listening socket, respawns a
worker that died (RestartPolicy: not after a startup failure, not in a crash loop) and tells the new
worker it is a respawn (WORKER_GENERATION_ENV), so /health says "restarting" until its models are back. A signal
that stops the worker before its models are up (EXIT_STOPPED_LOADING) ends this process as that signal's (130 for a
Ctrl-C), as it does before any worker started; a drained server exits 0.

granian 2.8's main loop respawns without telling a startup failure from a kill and only stops a crash
loop when deaths are under 5.5 s apart; `_serve_loop` is replaced here (granian's version is pinned). Its signal
handlers set a threading.Event, whose lock a second signal arriving inside that set() waited on forever (`uv run`
forwards SIGTERM, so `pkill` delivers two): `wake` never blocks in a handler. A second SIGINT/SIGTERM a moment
after the first stops the worker instead of waiting out its drain (the second Ctrl-C convention): the worker is told
to end its open streams now, each with an error event (shutting_down) and [DONE] (drain.HURRY_SIGNAL), and is killed
FORCED_STOP_SECONDS later if it has not gone (a third interrupt kills it at once); the process then exits
EXIT_FORCED_STOP, not 0: what was in flight did not finish.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from typing import Any

from granian.server.mp import MPServer

from service.process.drain import HURRY_SIGNAL
from service.process.restarts import EXIT_STOPPED_LOADING, RestartPolicy

__all__ = ["SupervisedGranian", "WORKER_GENERATION_ENV", "worker_generation", "wake", "EXIT_FORCED_STOP"]

# 0 for the first worker, n for the n-th respawn (read by the worker at startup).
WORKER_GENERATION_ENV = "TANDEM_WORKER_GENERATION"

_log = logging.getLogger("tandem.service")

# A second SIGINT/SIGTERM at least this long after the first kills the worker at once (streams are cut). Closer
# together they are one request: `uv run` forwards the SIGTERM that `pkill` also delivered itself.
FORCE_AFTER_SECONDS = 0.5
# After a second interrupt, how long the worker gets to write its streams' final events and go before it is killed.
FORCED_STOP_SECONDS = 3.0
# This process's exit status after a second interrupt stopped the drain.
EXIT_FORCED_STOP = 1


def worker_generation(environ: Any = None) -> int:
    """Which respawn this worker is (0: the first start). Raises nothing."""
    raw = (os.environ if environ is None else environ).get(WORKER_GENERATION_ENV, "0")
    return int(raw) if str(raw).isdigit() else 0


def wake(event: threading.Event) -> None:
    """Set `event` from a signal handler. A handler runs on the main thread between two bytecodes, possibly while
    that thread holds the event's lock (inside set() or wait()): then a helper thread sets it once the lock is
    free, instead of this thread waiting for itself. Raises nothing."""
    cond = getattr(event, "_cond", None)
    if cond is not None and cond.acquire(blocking=False):
        try:
            event._flag = True  # type: ignore[attr-defined]  # Event.set's own two lines, lock already held
            cond.notify_all()
        finally:
            cond.release()
        return
    threading.Thread(target=event.set, name="tandem-signal-wake", daemon=True).start()


class SupervisedGranian(MPServer):
    """granian's multiprocess server (worker processes, not threads), worker deaths through a RestartPolicy."""

    def __init__(self, *args: Any, policy: RestartPolicy | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.policy = policy or RestartPolicy()
        self.generation = 0
        self.exit_code = 0
        self.interrupted_at: float | None = None  # monotonic time of the first SIGINT/SIGTERM
        self.interrupted_by: int | None = None  # and its number
        self.forced = False  # a second interrupt cut the drain short

    def _init_shared_socket(self) -> None:
        """This process binds the port and its worker inherits the socket. On Linux granian lets each worker bind
        its own (SO_REUSEPORT), so the port was closed (connections refused, ~2.6 s) while a dead worker was
        respawned; held here, clients wait in the backlog for the new worker. Raises OSError when it cannot bind."""
        if self.bind_uds or sys.platform != "linux":
            super()._init_shared_socket()
            return
        from granian.net import SocketSpec

        self._ssp = None
        holder = SocketSpec(self.bind_addr, self.bind_port, self.backlog).build()
        self._shd, self._sfd = holder, holder.get_fd()  # type: ignore[assignment]  # granian's stubs say None
        self._sso = socket.socket(fileno=self._sfd)
        self._sso.set_inheritable(True)

    def signal_handler_interrupt(self, *args: Any, **kwargs: Any) -> None:
        now = time.monotonic()
        first: float | None = getattr(self, "interrupted_at", None)
        if first is None:
            self.interrupted_at = now
            self.interrupted_by = args[0] if args and isinstance(args[0], int) else None
        elif now - first >= FORCE_AFTER_SECONDS:
            if getattr(self, "forced", False):
                self.kill_workers()  # a third: no more waiting
            else:
                self.force_stop()
        self.interrupt_signal = True
        wake(self.main_loop_interrupt)

    def force_stop(self) -> None:
        """Stop now (the convention for a second Ctrl-C): each worker ends its open streams with their final events
        at once (HURRY_SIGNAL) and is killed FORCED_STOP_SECONDS later if it is still there; the main process then
        exits EXIT_FORCED_STOP. Runs in a signal handler: one os.kill a worker and a timer thread. Raises nothing."""
        _log.warning("second interrupt: stopping now; open streams end with an error event")
        self.forced = True
        for worker in list(getattr(self, "wrks", ())):
            pid = getattr(getattr(worker, "inner", None), "pid", None)
            try:
                if pid is not None:
                    os.kill(pid, HURRY_SIGNAL)
            except OSError:  # already gone
                pass
        timer = threading.Timer(FORCED_STOP_SECONDS, self.kill_workers)
        timer.daemon = True
        timer.start()

    def kill_workers(self) -> None:
        """Kill the workers still there: the drain's wait ends and the main process exits. Raises nothing."""
        for worker in list(getattr(self, "wrks", ())):
            try:
                if worker.is_alive():
                    _log.warning("worker-%d did not stop in time: killed", worker.idx + 1)
                    worker.kill()
            except (OSError, AttributeError, ValueError):  # not started yet, or already reaped
                pass

    def signal_handler_reload(self, *args: Any, **kwargs: Any) -> None:
        self.reload_signal = True
        wake(self.main_loop_interrupt)

    def _serve(self, spawn_target: Any, target_loader: Any) -> None:
        os.environ[WORKER_GENERATION_ENV] = "0"
        self.startup(spawn_target, target_loader)
        self._serve_loop(spawn_target, target_loader)
        workers = list(self.wrks)
        ended: SystemExit | None = None
        try:
            self.shutdown(self.exit_code)
        except SystemExit as exc:  # granian's exit code: 1 when a worker had died meanwhile
            ended = exc
        if (code := self.signal_exit_code([w.inner.exitcode for w in workers])) is not None:
            sys.exit(code)
        if ended is not None:
            raise ended

    def signal_exit_code(self, worker_codes: list[int | None]) -> int | None:
        """128 + the signal when a worker it stopped had not loaded its models yet (EXIT_STOPPED_LOADING), else
        EXIT_FORCED_STOP after a second interrupt, else None (granian's exit stands). Raises nothing."""
        signum = getattr(self, "interrupted_by", None)
        if signum is not None and EXIT_STOPPED_LOADING in worker_codes:
            return 128 + signum
        return EXIT_FORCED_STOP if getattr(self, "forced", False) else None

    def _serve_loop(self, spawn_target: Any, target_loader: Any) -> None:
        while True:
            self.main_loop_interrupt.wait()
            if self.interrupt_signal:
                return
            dead = list(self.interrupt_children)
            self.interrupt_children.clear()
            self.main_loop_interrupt.clear()
            for idx in dead:
                if not self._respawn(idx, spawn_target, target_loader):
                    return

    def _respawn(self, idx: int, spawn_target: Any, target_loader: Any) -> bool:
        exitcode = self.wrks[idx].inner.exitcode
        decision = self.policy.decide(exitcode, time.monotonic())
        if not decision.respawn:
            _log.error("worker-%d stopped for good: %s", idx + 1, decision.reason)
            self.exit_code = 1
            return False
        _log.warning("worker-%d: %s; respawning it%s", idx + 1, decision.reason,
                     f" in {decision.delay:g} s" if decision.delay else "")
        # Wait out the backoff, unless a signal asks the server to stop meanwhile.
        if decision.delay and self.main_loop_interrupt.wait(decision.delay) and self.interrupt_signal:
            return False
        self.generation += 1
        os.environ[WORKER_GENERATION_ENV] = str(self.generation)
        self._respawn_workers([idx], spawn_target, target_loader)
        return True
