"""A stop that reaches a model load in progress: the long one-off steps of a first start (a GGUF's conversion, a
Whisper import) look at a stop flag between tensors and before each file they write, and give up their staging
folder once it is set, so a Ctrl-C during a multi-GB conversion ends the process in moments and no half-written
cache entry is ever used.

`LOADS` is this process's flag: set when the process begins to stop (the granian worker's first SIGINT/SIGTERM, the
`--isolate` engine process told to stop). The converters read it unless a test hands them a flag of their own.
"""

from __future__ import annotations

import threading
from typing import Callable, Protocol

__all__ = ["LOADS", "LoadStopped", "StopFlag", "Stoppable", "check_stop"]


class LoadStopped(Exception):
    """A load given up because the process is stopping (nothing it wrote stays behind)."""


class Stoppable(Protocol):
    """What a converter reads: a threading.Event, or a StopFlag."""

    def is_set(self) -> bool: ...


class StopFlag:
    """Set once, from any thread; what registered with `on_set` runs then (once)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def is_set(self) -> bool:
        """Whether the stop came. Raises nothing."""
        return self._event.is_set()

    def set(self) -> None:
        """Stop: later checks raise LoadStopped; the callbacks registered run now, on this thread. Raises nothing
        (a failing callback is skipped)."""
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # one that cannot tell its load (a connection gone) must not keep the others from it
                pass

    def on_set(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run `callback` when the stop comes (now, if it came already). Returns what unregisters it. Raises what
        the callback raises when it runs now."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return lambda: self._forget(callback)
        callback()
        return lambda: None

    def _forget(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)


LOADS = StopFlag()


def check_stop(stop: Stoppable | None, doing: str) -> None:
    """Raise LoadStopped ("stopped while `doing`") when `stop` (None: this process's LOADS) is set."""
    if (LOADS if stop is None else stop).is_set():
        raise LoadStopped(f"stopped while {doing}: the server is shutting down")
