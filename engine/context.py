"""Engine threads: MLX work runs on them, since MLX streams belong to the thread that made them (the decode thread,
and on a GPU a second one for prompt chunks: engine/lane.py's prefill lane)."""

from __future__ import annotations

import asyncio
import os
import queue
import sys
import threading
from typing import Any, Callable

import anyio
import anyio.from_thread
import anyio.lowlevel

__all__ = ["EngineThread", "loop_caller"]


class EngineThread:
    """Runs callables one at a time on one dedicated daemon thread; `run` is awaited from the event loop."""

    def __init__(self, name: str = "tandem-engine", nice: int = 0) -> None:
        """`nice`: how much lower this thread's CPU priority is than the process's (Linux, where threads have
        their own; MLX's stream worker, which this thread's first MLX op starts, inherits it)."""
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Callable[[Any, BaseException | None], None]] | None] = (
            queue.SimpleQueue()
        )
        self.nice = nice
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self.busy_seconds = 0.0

    def is_current(self) -> bool:
        """Whether the caller runs on this thread. Raises nothing."""
        return threading.current_thread() is self._thread

    def _main(self) -> None:
        import time

        if self.nice > 0 and sys.platform.startswith("linux"):
            try:  # before any job: the threads this one starts (MLX's stream worker) inherit the priority
                me = threading.get_native_id()
                os.setpriority(os.PRIO_PROCESS, me, os.getpriority(os.PRIO_PROCESS, me) + self.nice)
            except OSError:
                pass
        while (job := self._jobs.get()) is not None:
            fn, done = job
            t0 = time.perf_counter()
            try:
                result, error = fn(), None
            except BaseException as exc:  # delivered to the awaiter, never kills the thread
                result, error = None, exc
            self.busy_seconds += time.perf_counter() - t0
            done(result, error)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run fn(*args) on the engine thread and return its result. Shielded: once submitted it
        completes before this returns, so native resources are never freed under a running step."""
        finished = anyio.Event()
        box: list[Any] = []
        wake = _waker(finished)

        def done(result: Any, error: BaseException | None) -> None:
            box.extend((result, error))
            wake()

        self._jobs.put((lambda: fn(*args), done))
        with anyio.CancelScope(shield=True):
            await finished.wait()
        result, error = box
        if error is not None:
            raise error
        return result

    def submit(self, fn: Callable[[], Any], done: Callable[[Any, BaseException | None], None]) -> None:
        """Queue fn() without waiting for it; done(result, error) is then called on this thread (hop to the
        event loop with `loop_caller`). Raises nothing."""
        self._jobs.put((fn, done))

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Blocking variant for non-async callers (CLI); must not be used from the event loop."""
        ev = threading.Event()
        box: list[Any] = []

        def done(result: Any, error: BaseException | None) -> None:
            box.extend((result, error))
            ev.set()

        self._jobs.put((lambda: fn(*args), done))
        ev.wait()
        result, error = box
        if error is not None:
            raise error
        return result

    def close(self, join_timeout: float | None = 5.0) -> None:
        """Stop the thread after the jobs already queued, and wait for it (up to `join_timeout` s): a thread
        that used MLX and is still alive at interpreter exit can abort the process. Raises nothing."""
        self._jobs.put(None)
        if threading.current_thread() is not self._thread and join_timeout != 0:
            self._thread.join(join_timeout)
            _wait_for_os_exit(self._thread, join_timeout)


def loop_caller() -> Callable[..., None]:
    """Bound to the running event loop: `call(fn, *args)` runs fn(*args) on it from any thread, in calling order,
    without waiting for it (asyncio's thread-safe callbacks are FIFO; off asyncio the call waits until it ran).
    From the loop's own thread (an inline context) fn runs at once. Raises RuntimeError once the loop closed."""
    loop_thread = threading.get_ident()
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    token = anyio.lowlevel.current_token()

    def call(fn: Callable[..., Any], *args: Any) -> None:
        if threading.get_ident() == loop_thread:
            fn(*args)
        elif loop is not None:
            loop.call_soon_threadsafe(fn, *args)
        else:
            anyio.from_thread.run_sync(fn, *args, token=token)

    return call


def _waker(event: anyio.Event) -> Callable[[], None]:
    """A thread-safe `event.set` that does not wait for the event loop to run it (the engine thread goes
    straight on to its next job)."""
    call = loop_caller()

    def wake() -> None:
        try:
            call(event.set)
        except RuntimeError:  # event loop already closed (shutdown)
            pass

    return wake


def _wait_for_os_exit(thread: threading.Thread, timeout: float | None) -> None:
    # join() returns before the OS thread runs its C++ thread-local destructors (MLX's compile cache, which
    # takes the GIL); if the interpreter is finalizing by then the process aborts. On Linux, wait them out.
    import os
    import time

    task = f"/proc/self/task/{thread.native_id}"
    deadline = time.monotonic() + (timeout if timeout is not None else 5.0)
    while not thread.is_alive() and os.path.exists(task) and time.monotonic() < deadline:
        time.sleep(0.001)
