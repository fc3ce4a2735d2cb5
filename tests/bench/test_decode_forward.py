"""bench/decode_forward.py: one forward of R rows timed per way of running it, on a real checkpoint layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import decode_forward
from tests.fixtures.tiny_whisper import build_tiny_whisper


def test_every_mode_and_row_count_gets_its_forwards_timed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_WHISPER_BATCH", "off")  # the modes set these for themselves; the test restores them
    monkeypatch.setenv("TANDEM_WHISPER_COMPILE", "off")
    ckpt = build_tiny_whisper(tmp_path / "w")
    out = tmp_path / "f.json"
    assert decode_forward.main(["--whisper", str(ckpt), "--rows", "1,3", "--forwards", "3", "--warm", "1",
                                "--rounds", "1", "--out", str(out)]) == 0
    lines = json.loads(out.read_text())
    assert [(x["mode"], x["rows"]) for x in lines] == [(m, n) for m in ("rows", "batch", "compiled") for n in (1, 3)]
    # end-of-text is suppressed, so every row stays for every timed forward
    assert all(x["forwards"] == 3 and 0 < x["ms_min"] <= x["ms_p50"] for x in lines)
