"""StepHealth — whether the group can still run rows: steps failed in a row (any success resets the run) and the
last failure, for /health. A fault in one step fails only its rows; several in a row mean the engine itself
(a lost device, a broken model) fails everything it touches."""

from __future__ import annotations

__all__ = ["StepHealth"]

FAILURES_IN_A_ROW = 3  # enough that one bad request's fault never marks the engine unhealthy


class StepHealth:
    def __init__(self) -> None:
        self.in_a_row = 0
        self.last_error: str | None = None

    def failed(self, exc: BaseException) -> str:
        """Count a failed step or lane job; returns the error text its rows get. Raises nothing."""
        self.in_a_row += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        return self.last_error

    def succeeded(self) -> None:
        self.in_a_row = 0

    @property
    def ok(self) -> bool:
        return self.in_a_row < FAILURES_IN_A_ROW
