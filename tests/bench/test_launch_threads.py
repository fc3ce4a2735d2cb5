"""bench/launch_threads.py: launch time per op, alone, beside a second launching thread and beside Python work."""

from __future__ import annotations

import json

from bench.launch_threads import launch_us_per_op, main


def test_each_round_gives_a_positive_time_per_op() -> None:
    us = launch_us_per_op(ops=20, rounds=3, size=64)
    assert len(us) == 3 and all(u > 0 for u in us)


def test_main_reports_the_three_cases(capsys) -> None:
    assert main(["--ops", "20", "--rounds", "3", "--size", "64"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["ops"] == 40
    assert set(result) >= {"alone", "two_launching", "beside_python"}
    assert set(result["two_launching"]) == {"this", "other"} and set(result["beside_python"]) == {"this"}
    assert result["alone"]["p50_us_per_op"] > 0
