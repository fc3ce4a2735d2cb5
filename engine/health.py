"""StepHealth — whether the group can still run rows: steps failed in a row (any success resets the run) and the
last failure, for /health. A fault in one step fails only its rows; several in a row mean the engine itself
(a lost device, a broken model) fails everything it touches. And whether it still runs at all: rows waiting while
no step has landed for STALL_SECONDS mean a stuck engine (a hung device), which nothing else would report."""

from __future__ import annotations

import time

__all__ = ["StepHealth", "STALL_SECONDS"]

FAILURES_IN_A_ROW = 3  # enough that one bad request's fault never marks the engine unhealthy
# Far above any step's time (a prefill chunk is bounded by the iteration budget; shapes compile at warm-up).
STALL_SECONDS = 60.0


class StepHealth:
    def __init__(self) -> None:
        self.in_a_row = 0
        self.last_error: str | None = None
        self._progress = time.monotonic()  # the last step that landed, or when rows began to wait after idling

    def failed(self, exc: BaseException) -> str:
        """Count a failed step or lane job; returns the error text its rows get. Raises nothing."""
        self.in_a_row += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        self._progress = time.monotonic()
        return self.last_error

    def succeeded(self) -> None:
        self.in_a_row = 0
        self._progress = time.monotonic()

    def waiting_from_idle(self) -> None:
        """A row arrived at an idle engine: its wait, not the idle time before it, counts toward a stall. Raises
        nothing."""
        self._progress = time.monotonic()

    def stalled(self, waiting: bool) -> float | None:
        """Seconds since the last step landed while rows wait, once past STALL_SECONDS; None otherwise. Raises
        nothing."""
        since = time.monotonic() - self._progress
        return since if waiting and since > STALL_SECONDS else None

    @property
    def ok(self) -> bool:
        return self.in_a_row < FAILURES_IN_A_ROW

    def report(self, waiting: int) -> dict[str, object]:
        """/health's view, `waiting` rows running or queued: {"ok": True}, or why not. Raises nothing."""
        if not self.ok:
            return {"ok": False, "error": self.last_error, "failed_steps_in_a_row": self.in_a_row}
        if (since := self.stalled(waiting > 0)) is not None:
            return {"ok": False, "error": f"no engine step has finished for {since:.0f} s while {waiting} rows wait "
                                          f"(a hung device?)"}
        return {"ok": True}
