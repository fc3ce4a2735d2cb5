"""bench/gil_return.py: a row per round and mode, each call's lateness measured, the interval restored."""

from __future__ import annotations

import json
import sys

from bench.gil_return import late_ms, main
from engine.gil import QuickReturn


def test_late_ms_measures_each_call() -> None:
    late = late_ms(QuickReturn(None), 5, 0.0005)
    assert len(late) == 5 and late == sorted(late) and late[0] > -0.5


def test_main_reports_both_modes_each_round_and_restores_the_interval(capsys) -> None:
    before = sys.getswitchinterval()
    assert main(["--calls", "3", "--call-ms", "0.2", "--rounds", "2"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [(r["round"], r["mode"]) for r in rows] == [(1, "switch interval"), (1, "quick return"),
                                                        (2, "switch interval"), (2, "quick return")]
    assert all(r["late_ms_max"] >= r["late_ms_p90"] >= r["late_ms_p50"] for r in rows)
    assert sys.getswitchinterval() == before
