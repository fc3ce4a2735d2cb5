"""audio/session_pump.py: the gate a live session's audio passes through. (The pump itself runs in every
LiveSession test: tests/audio/test_sessions.py.)"""

from __future__ import annotations

import pytest

from audio.errors import InvalidOption
from audio.session_pump import speech_gate
from audio.transcript import TranscribeOptions
from tests.audio.conftest import SR


def test_vad_settings_reach_the_gate() -> None:
    gate = speech_gate(TranscribeOptions(vad_min_silence_ms=900, vad_padding_ms=300, vad_aggressiveness=3))
    assert gate is not None and gate._gap == 30 and gate._pad == 300 * SR // 1000
    assert speech_gate(TranscribeOptions(temperatures=(0.0,), vad=False)) is None
    with pytest.raises(InvalidOption):
        TranscribeOptions(vad_aggressiveness=4)
