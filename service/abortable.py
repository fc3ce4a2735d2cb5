"""Blocking Python work in a worker thread that can actually be stopped: on a timeout, or when the awaiting
task is cancelled (its client left), an exception is raised inside the thread and the caller waits for
the thread to unwind, so a shared resource the work holds is never used by two threads at once.

Only for pure-Python work (jinja rendering): the exception lands between bytecodes, so a long C call
finishes first, and code that must not be interrupted halfway (a tokenizer's encode) does not belong here.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any, Callable, Generic, TypeVar

import anyio

__all__ = ["Aborted", "run_abortable"]

T = TypeVar("T")

_log = logging.getLogger("tandem.service")

# How long an aborted call may take to unwind before the caller stops waiting for it (logged).
_UNWIND_SECONDS = 30.0


class Aborted(Exception):
    """Raised inside the worker thread to stop the work (timeout or caller cancelled)."""


class _Call(Generic[T]):
    def __init__(self, fn: Callable[..., T], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.lock = threading.Lock()
        self.ident: int | None = None
        self.running = False
        self.aborted = False
        self.stopped = threading.Event()

    def run(self) -> T:
        try:
            with self.lock:
                if self.aborted:  # aborted before a worker thread picked it up
                    raise Aborted()
                self.ident, self.running = threading.get_ident(), True
            try:
                return self.fn(*self.args)
            finally:
                with self.lock:
                    self.running = False
        finally:
            self.stopped.set()

    def abort(self) -> bool:
        """Stop the work; True when `fn` was running, so the caller must wait for `stopped`.

        False: `fn` never starts now (a thread picking the call up later sees `aborted`), or it has returned;
        anyio may also drop a call cancelled before any thread took it, and then `stopped` is never set."""
        # Under the lock, so the exception is only ever aimed at a thread still inside `fn`.
        with self.lock:
            self.aborted = True
            if self.running and self.ident is not None:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.ident), ctypes.py_object(Aborted))
                return True
            return False


async def run_abortable(fn: Callable[..., T], *args: Any, timeout: float,
                        limiter: anyio.CapacityLimiter | None = None) -> T:
    """fn(*args) in a worker thread, holding `limiter` until the thread has really stopped.

    Raises TimeoutError after `timeout` seconds (the work aborted), the caller's cancellation (the work
    aborted too), or whatever fn raises."""
    call = _Call(fn, args)
    async with limiter if limiter is not None else anyio.CapacityLimiter(1):
        try:
            with anyio.fail_after(timeout):
                return await anyio.to_thread.run_sync(call.run, abandon_on_cancel=True)
        except BaseException:
            if not call.stopped.is_set() and call.abort():
                with anyio.CancelScope(shield=True):
                    if not await anyio.to_thread.run_sync(call.stopped.wait, _UNWIND_SECONDS):
                        _log.error("aborted work %s did not stop within %.0f s", getattr(fn, "__name__", fn),
                                   _UNWIND_SECONDS)
            raise
