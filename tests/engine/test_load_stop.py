"""engine/load_stop.py: the stop a load in progress reads, and what it tells when it comes."""

from __future__ import annotations

import pytest

from engine.load_stop import LoadStopped, StopFlag, check_stop


def test_a_stop_runs_what_waits_for_it_once_and_then_checks_raise() -> None:
    stop, told = StopFlag(), []
    stop.on_set(lambda: told.append("first"))
    forget = stop.on_set(lambda: told.append("forgotten"))
    stop.on_set(lambda: 1 / 0)  # one that cannot tell its load keeps no other from it
    stop.on_set(lambda: told.append("last"))
    forget()
    check_stop(stop, "loading")  # not yet
    stop.set()
    stop.set()
    assert told == ["first", "last"]
    with pytest.raises(LoadStopped, match="stopped while loading"):
        check_stop(stop, "loading")
    stop.on_set(lambda: told.append("late"))  # registered after the stop: runs at once
    assert told == ["first", "last", "late"]
