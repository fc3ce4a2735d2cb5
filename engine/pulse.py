"""Pulse: an event that can fire again. Waiters of one firing wake; later waiters wait for the next."""

from __future__ import annotations

import anyio

__all__ = ["Pulse"]


class Pulse:
    """anyio.Event set and replaced on each `fire()`: the pattern the group's wake-ups, its landed steps and the task
    queue's changes each wrote out. Event loop."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def fire(self) -> None:
        """Wake whoever waits now. Raises nothing."""
        self._event.set()
        self._event = anyio.Event()

    def current(self) -> anyio.Event:
        """The event the next fire sets: bind it now to not miss a fire that happens before you wait. Raises nothing."""
        return self._event

    async def wait(self) -> None:
        """Return at the next fire. Raises nothing but cancellation."""
        await self._event.wait()
