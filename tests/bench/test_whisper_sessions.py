"""bench/whisper_sessions.py: mlx-whisper once per session over the live benchmark's speaker signals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import whisper_sessions
from tests.fixtures.tiny_whisper import build_tiny_whisper


def test_each_speaker_count_is_transcribed_once_per_session(tmp_path: Path) -> None:
    ckpt = build_tiny_whisper(tmp_path / "w")
    out = tmp_path / "s.json"
    assert whisper_sessions.main(["--whisper", str(ckpt), "--speakers", "1,2", "--seconds", "2", "--modes", "greedy",
                                  "--out", str(out)]) == 0
    lines = json.loads(out.read_text())
    assert [(x["mode"], x["speakers"]) for x in lines] == [("greedy", 1), ("greedy", 2)]
    assert all(x["seconds"] > 0 and x["audio_s_each"] >= 2 for x in lines)
    assert lines[1]["x_real_time"] == pytest.approx(lines[1]["seconds"] / lines[1]["audio_s_each"], rel=0.1, abs=0.02)
