"""Requests in flight, counted so that a draining server knows when the last one has ended, and the drain's
signal to the connections that would never end by themselves (live websockets)."""

from __future__ import annotations

import anyio

__all__ = ["InFlight"]


class InFlight:
    """A counter of open requests and websockets with an "idle" event (count back at zero), and a "stopping"
    one (the server drains)."""

    def __init__(self) -> None:
        self.count = 0
        self.stopping = False
        self._idle: anyio.Event | None = None
        self._stop: anyio.Event | None = None  # made on first wait: an Event needs a running event loop

    def enter(self) -> None:
        """One more request. Raises nothing."""
        self.count += 1

    def exit(self) -> None:
        """One request ended. Raises nothing."""
        self.count -= 1
        if self.count <= 0 and self._idle is not None:
            self._idle.set()
            self._idle = None

    async def wait_idle(self) -> None:
        """Return once no request is open (at once when none is). Raises nothing."""
        if self.count <= 0:
            return
        if self._idle is None:
            self._idle = anyio.Event()
        await self._idle.wait()

    def stop(self) -> None:
        """The server drains: wake every `wait_stopping`. Raises nothing."""
        self.stopping = True
        if self._stop is not None:
            self._stop.set()

    async def wait_stopping(self) -> None:
        """Return once the server drains (at once when it already does). Raises nothing."""
        if self.stopping:
            return
        if self._stop is None:
            self._stop = anyio.Event()
        await self._stop.wait()
