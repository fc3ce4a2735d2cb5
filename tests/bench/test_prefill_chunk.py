"""bench/prefill_chunk.py: both attention modes measured on a tiny model, each round alternating them."""

from __future__ import annotations

import json

from bench import prefill_chunk


def test_measures_both_modes_at_each_offset(tiny_llm_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TANDEM_PREFILL_ATTENTION", "sdpa")  # the bench sets it: undone after the test
    out = tmp_path / "rows.json"
    assert prefill_chunk.main([str(tiny_llm_dir), "--chunk", "4", "--offsets", "0,8", "--repeats", "1",
                               "--rounds", "2", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["offset"], r["mode"]) for r in rows] == [(0, "sdpa"), (0, "grouped"), (0, "grouped"), (0, "sdpa"),
                                                        (8, "sdpa"), (8, "grouped"), (8, "grouped"), (8, "sdpa")]
    assert all(0 < r["build"] <= r["total"] and r["launch_cpu"] >= 0 for r in rows)
