"""WaitingRows — the rows submitted but not yet admitted: the `max_queued` limit, admission order, and shutdown.

A row waits here until `max_active` and the memory budget's KV room let it in (engine/admission.py decides which,
oldest first). The queue limit counts requests that really wait: a request's choices (GenerationRequest.origin) are
one, rows the next admission pass takes do not count, nor a newcomer a free row is left for. Event loop only, like
the batch group that owns it (engine/batch.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

from engine.admission import KVAdmission, admissible
from engine.contracts import GenerationRequest
from engine.errors import QueueFull
from engine.rows import Row, RowState

__all__ = ["WaitingRows"]


class WaitingRows:
    """Rows waiting for admission: oldest first, a request's later choices interleaved with other requests' (append)."""

    def __init__(self, *, max_active: int, max_queued: int | None, max_kv_tokens: int | None,
                 admission: KVAdmission | None) -> None:
        if max_queued is not None and max_queued < 0:
            raise ValueError("max_queued must be >= 0 (None: unbounded)")
        self.max_active = max_active
        self.max_queued = max_queued  # rows waiting beyond this are refused (QueueFull)
        self.max_kv_tokens = max_kv_tokens
        self.admission = admission
        self._rows: deque[Row] = deque()

    def __iter__(self) -> Iterator[Row]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index: int) -> Row:
        return self._rows[index]

    def check_room(self, active: Sequence[Row], request: GenerationRequest) -> None:
        """Raise QueueFull when `max_queued` requests already wait beside `active` and `request` would be another;
        else nothing. A request's later choice (choice > 0) is never refused: its first was let in, and the service
        bounds how many follow (service/chat/choices.py), so they hold no other client's place."""
        if self.max_queued is None or request.choice > 0:
            return
        # Free rows alone let max_queued + max_active - 1 wait; the limit keeps one free row for a newcomer, so
        # max_queued 0 still serves an idle server. A finished row whose step has not landed yet is no longer busy:
        # a client sending its next request as the last reply ends was refused (429) while nothing else ran.
        active = [r for r in active if not r.finished]
        joining = {id(r) for r in self.admissible(active)}
        queued = [r for r in self._rows if not r.cancelled]
        room = len(joining) == len(queued) and len(active) + len(joining) < self.max_active
        # Counted by request: one n = 12 request's 8 waiting choices took every place (429 for everyone else); one
        # whose first choice runs while later ones wait still counts once.
        waiting = len({_request_key(r) for r in queued if id(r) not in joining}) - room
        if waiting >= self.max_queued:
            raise QueueFull(f"{waiting} requests are already waiting for a row (limit {self.max_queued}); retry later",
                            queued=waiting, limit=self.max_queued)

    def append(self, row: Row) -> None:
        """Queue `row` behind every waiting row of an earlier or equal choice (GenerationRequest.choice): arrival order
        among first choices, and a request's later choices round-robin with other requests' (a 64-choice request
        queued 48 rows ahead of a chat that came after it: 34 s to its first token). Raises nothing."""
        choice = row.request.choice
        if not self._rows or self._rows[-1].request.choice <= choice:
            self._rows.append(row)
            return
        at = next(i for i, waiting in enumerate(self._rows) if waiting.request.choice > choice)
        self._rows.insert(at, row)

    def admissible(self, active: Sequence[Row]) -> list[Row]:
        """The waiting rows the next admission pass would take beside `active`, in order. Raises nothing."""
        return admissible(self._rows, active, max_active=self.max_active, max_kv_tokens=self.max_kv_tokens,
                          admission=self.admission)

    def admit(self, active: list[Row]) -> None:
        """Move the admissible rows into `active` (state ACTIVE). Raises nothing."""
        for row in self.admissible(active):
            self._rows.remove(row)
            row.state = RowState.ACTIVE
            active.append(row)

    def drop_cancelled(self) -> list[Row]:
        """Remove and return the cancelled rows. Raises nothing."""
        gone = [r for r in self._rows if r.cancelled]
        for row in gone:
            self._rows.remove(row)
        return gone

    def take_all(self) -> list[Row]:
        """Remove and return every row (shutdown ends them). Raises nothing."""
        rows = list(self._rows)
        self._rows.clear()
        return rows

    def count(self) -> int:
        """Rows really waiting (cancelled ones leave at the next prune). Raises nothing."""
        return sum(1 for r in self._rows if not r.cancelled)

    def room_to_join(self, active: Sequence[Row]) -> bool:
        return bool(self._rows) and len(active) < self.max_active


def _request_key(row: Row) -> object:
    """The request `row` answers: its origin, shared by the request's choices, else the row itself."""
    origin = row.request.origin
    return origin if origin is not None else id(row)
