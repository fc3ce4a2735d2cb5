"""bench/prefill_thread.py on the tiny model: decode steps alone, with packed chunks and beside a second thread
that prefills, and a prompt prefilled there decoded on the main thread."""

from __future__ import annotations

import json

from bench import prefill_thread


def test_prefill_thread_measures_the_three_ways_and_crosses_threads(tiny_llm_dir, capsys) -> None:
    assert prefill_thread.main([str(tiny_llm_dir), "--rows", "3", "--context", "8", "--chunk", "6", "--steps", "8",
                                "--every", "2", "--gap-ms", "0"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("decode_alone", "decode_mixed", "decode_beside_thread"):
        assert out[key]["n"] == 8 and 0 < out[key]["p50_ms"] <= out[key]["max_ms"]
    assert out["thread_error"] is None and out["thread_prompt_tok_s"] > 0
    assert out["cross_thread_adopt"] == "ok, 4 rows decoded"
