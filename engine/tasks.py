"""ExecutionTasks — a cancellable queue of work that borrows the execution lease between LLM iterations."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Generic, TypeVar

import anyio
from anyio import CancelScope

from engine.contracts import ExecutionContext
from engine.errors import TaskRejected
from engine.pulse import Pulse

__all__ = ["ExecutionTasks", "TaskHandle", "TaskRejected"]

T = TypeVar("T")


@dataclass(eq=False)
class TaskHandle(Generic[T]):
    """One queued unit of engine-thread work; await it for the result."""

    work: Callable[[], T]
    label: str
    cancellation: CancelScope | None
    started: bool = False
    done: anyio.Event = field(default_factory=anyio.Event)
    _result: Any = None
    _error: BaseException | None = None

    @property
    def cancelled(self) -> bool:
        return self.cancellation is not None and self.cancellation.cancel_called

    def result(self) -> T:
        if self._error is not None:
            raise self._error
        return self._result

    def __await__(self) -> Generator[Any, None, T]:
        return self._wait().__await__()

    async def _wait(self) -> T:
        await self.done.wait()
        return self.result()


class ExecutionTasks:
    """FIFO of lease-borrowing work. The driver runs at most one per iteration via `advance`."""

    def __init__(self) -> None:
        self._queue: deque[TaskHandle[Any]] = deque()
        self._changed = Pulse()
        self._rejected: str | None = None  # set by reject_all: nothing queues any more
        self.completed = 0
        self._last_run: dict[str, float] = {}  # label → time.monotonic() its latest task finished

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def pending(self) -> bool:
        return any(not t.cancelled for t in self._queue)

    def labels(self) -> list[str]:
        return [t.label for t in self._queue]

    def enqueue(self, work: Callable[[], T], cancellation: CancelScope | None = None, label: str = "") -> TaskHandle[T]:
        """Queue work; the handle is awaitable. A cancelled `cancellation` scope drops it before it starts.
        After reject_all the handle is already failed with TaskRejected (no driver will run it)."""
        handle: TaskHandle[T] = TaskHandle(work, label or getattr(work, "__name__", "task"), cancellation)
        if self._rejected is not None:
            handle._error = TaskRejected(self._rejected)
            handle.done.set()
            return handle
        self._queue.append(handle)
        self._notify()
        return handle

    async def run(self, work: Callable[[], T], label: str = "") -> T:
        """Enqueue and await. Cancelled while queued: removed, never runs, CancelledError propagates.
        Cancelled while running: waits (shielded) for it to finish, then propagates the cancellation."""
        handle = self.enqueue(work, None, label)
        try:
            await handle.done.wait()
        except anyio.get_cancelled_exc_class():
            if handle.started:
                with CancelScope(shield=True):
                    await handle.done.wait()
            else:
                self._discard(handle)
            raise
        return handle.result()

    def prune(self) -> int:
        """Remove queued tasks whose cancellation scope was cancelled; their awaiters see TaskRejected."""
        dropped = [t for t in self._queue if t.cancelled]
        for t in dropped:
            self._discard(t)
            t._error = TaskRejected(f"{t.label}: cancelled before it ran")
            t.done.set()
        return len(dropped)

    async def advance(self, context: ExecutionContext) -> bool:
        """Run the first live task on the engine thread to completion. Returns False when none was pending."""
        self.prune()
        if not self._queue:
            return False
        handle = self._queue.popleft()
        handle.started = True
        try:
            with CancelScope(shield=True):
                handle._result = await context.run(handle.work)
        except Exception as exc:  # the awaiter gets the error; the loop goes on
            handle._error = exc
        finally:
            self.completed += 1
            self._last_run[handle.label] = time.monotonic()
            handle.done.set()
        return True

    def ran_within(self, seconds: float, *, besides: str) -> bool:
        """Whether a task labelled other than `besides` finished in the last `seconds`. Raises nothing."""
        now = time.monotonic()
        return any(now - at < seconds for label, at in self._last_run.items() if label != besides)

    def reject_all(self, reason: str = "shutting down") -> None:
        """Fail every queued task and every later one (used at shutdown), and wake the waiters. Raises nothing."""
        self._rejected = reason
        while self._queue:
            t = self._queue.popleft()
            t._error = TaskRejected(reason)
            t.done.set()
        self._notify()

    async def wait_changed(self) -> None:
        """Return at the next enqueue or notify. Raises nothing but cancellation."""
        await self._changed.wait()

    def changed(self) -> anyio.Event:
        """The event the next enqueue or notify sets: bind it now to not miss one that happens before
        you wait. Raises nothing."""
        return self._changed.current()

    def notify(self) -> None:
        """Wake whoever waits for a change (e.g. a closing group's driver). Raises nothing."""
        self._notify()

    def _discard(self, handle: TaskHandle[Any]) -> None:
        try:
            self._queue.remove(handle)
        except ValueError:
            pass

    def _notify(self) -> None:
        self._changed.fire()
