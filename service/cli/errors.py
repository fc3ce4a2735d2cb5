"""CLIError — an expected failure of a command, printed as one line on stderr (no traceback)."""

from __future__ import annotations

__all__ = ["CLIError"]


class CLIError(Exception):
    """A failure to report as one line (exit code 2 unless given)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code
