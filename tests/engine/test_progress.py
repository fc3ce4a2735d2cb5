"""engine/progress.py: a bar on a terminal, nothing on a pipe."""

from __future__ import annotations

import io
import sys

import pytest

from engine.progress import progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stream, shown", [(_Terminal(), True), (io.StringIO(), False)])
def test_bar_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch, stream: io.StringIO, shown: bool) -> None:
    monkeypatch.setattr(sys, "stderr", stream)
    assert list(progress(range(4), "converting demo")) == [0, 1, 2, 3]
    assert ("converting demo" in stream.getvalue() and "/4 [" in stream.getvalue()) is shown
