"""audio/vad.py: speech runs, the min-speech rule, trimming."""

from __future__ import annotations

import numpy as np
import pytest

from audio.vad import has_speech, speech_segments, trim_silence
from tests.audio.conftest import SR, voiced


def test_silence_has_no_speech() -> None:
    assert speech_segments(np.zeros(SR * 2, np.float32)) == []
    assert not has_speech(np.zeros(SR, np.float32))


def test_a_voiced_run_between_silences_is_found() -> None:
    x = np.concatenate([np.zeros(SR), voiced(1.0), np.zeros(SR)])
    (start, end), = speech_segments(x, padding_ms=0)
    assert abs(start - SR) <= 0.1 * SR and abs(end - 2 * SR) <= 0.1 * SR  # webrtcvad hangover


def test_runs_shorter_than_min_speech_are_dropped() -> None:
    x = np.concatenate([np.zeros(SR), voiced(0.12), np.zeros(SR)])
    assert has_speech(x, min_speech_ms=60)
    assert not has_speech(x, min_speech_ms=400)


def test_trim_cuts_leading_and_trailing_silence() -> None:
    x = np.concatenate([np.zeros(2 * SR), voiced(1.0), np.zeros(SR)])
    trimmed, cut = trim_silence(x)
    assert abs(cut - 2 * SR) < 0.2 * SR
    assert 0.9 * SR < len(trimmed) < 1.4 * SR
    empty, _ = trim_silence(np.zeros(SR, np.float32))
    assert len(empty) == 0


def test_bad_aggressiveness() -> None:
    with pytest.raises(ValueError):
        speech_segments(np.zeros(SR, np.float32), aggressiveness=4)
