"""bench/mixed_launch.py on the tiny model: decode-only and mixed trials report build, launch and wait times."""

from __future__ import annotations

import json

from bench import mixed_launch


def test_mixed_launch_reports_each_mode_and_offset(tiny_llm_dir, capsys) -> None:
    assert mixed_launch.main([str(tiny_llm_dir), "--rows", "3", "--context", "8", "--chunk", "6", "--offsets", "0,16",
                              "--trials", "2"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out) >= {"decode@0", "mixed@0", "mixed@16"} and "decode@16" not in out  # decode has no offset
    for key in ("decode@0", "mixed@0", "mixed@16"):
        assert set(out[key]) == {"build_ms", "launch_ms", "wait_ms"} and all(v >= 0 for v in out[key].values())
