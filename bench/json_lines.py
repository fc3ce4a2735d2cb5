"""Results of a benchmark that prints one JSON line per measurement: each printed as it comes and the whole list
rewritten to `--out` after each, so a run cut short by its time limit keeps what it measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["JsonLines"]


class JsonLines:
    """Collects result lines; `out` (or None) gets them all, as a JSON list, after each `add`."""

    def __init__(self, out: Path | None) -> None:
        self.out = out
        self.lines: list[dict[str, Any]] = []

    def add(self, line: dict[str, Any]) -> None:
        """Print `line` and keep it. Raises OSError when `out` cannot be written."""
        print(json.dumps(line), flush=True)
        self.lines.append(line)
        if self.out is not None:
            self.out.write_text(json.dumps(self.lines, indent=1))
