"""Utterances — where a live session's utterances end and which of them are closed.

Utterances are numbered from 0 (`item` in every event): the audio between two pauses is one utterance, and
every pause closes exactly one — with an `utterance` event carrying its text, empty when it had none (a
session behind decodes several at once: the first gets their text). Text is attributed to the oldest
utterance not yet closed.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from audio.live_config import SessionEvent

__all__ = ["Utterances"]


class Utterances:
    """Pauses not yet closed (compact positions), the utterance counts and the oldest open one's committed text.
    Not thread-safe; event loop only."""

    def __init__(self, emit: Callable[[SessionEvent], None]) -> None:
        self._emit = emit
        self.pauses: deque[int] = deque()  # compact positions where an utterance ended, not yet closed
        self.opened = 0  # utterances whose audio ended (pauses added); the open one's index
        self.closed = 0  # utterances transcribed and closed; the oldest open one's index
        self.open_from = 0  # compact position where the open utterance began
        self.text: list[str] = []  # committed text of the oldest utterance not yet closed

    def pause(self, at: int) -> int:
        """The open utterance ended at `at` (even an empty one). Returns its index. Raises nothing."""
        self.pauses.append(at)
        self.open_from = at
        self.opened += 1
        return self.opened - 1

    @property
    def open_text(self) -> bool:
        """Committed text belongs to the open utterance (none is behind it). Raises nothing."""
        return not self.pauses and bool(self.text)

    def close(self, count: int) -> None:
        """The `count` oldest pauses are done: their utterances close, the first with the text so far."""
        for _ in range(count):
            self.pauses.popleft()
            text = "".join(self.text)
            self.text = []
            self._emit(SessionEvent("utterance", text=text, item=self.closed))
            self.closed += 1

    def close_through(self, limit: int) -> None:
        """Close the utterances whose pauses are at or before `limit`. Raises nothing."""
        self.close(sum(1 for p in self.pauses if p <= limit))
