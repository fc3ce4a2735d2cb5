"""Requests in flight, counted so that a draining server knows when the last one has ended."""

from __future__ import annotations

import anyio

__all__ = ["InFlight"]


class InFlight:
    """A counter of open requests and websockets with an "idle" event (count back at zero)."""

    def __init__(self) -> None:
        self.count = 0
        self._idle: anyio.Event | None = None

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
