"""audio/window.py: when a decoded window asks for the next temperature (openai-whisper's transcribe() rule)."""

from __future__ import annotations

import numpy as np

from audio.decoder import RowResult
from audio.window import WindowRequest


def result(avg_logprob: float = -0.2, no_speech_prob: float = 0.1, compression_ratio: float = 1.5) -> RowResult:
    return RowResult([1, 2], [2], "x", avg_logprob, no_speech_prob, 0.0, compression_ratio)


def test_a_repetitive_or_improbable_window_falls_back_unless_it_is_silence() -> None:
    request = WindowRequest(audio=np.zeros(16000, np.float32), frames=100)
    assert not request.needs_fallback(result())
    assert request.needs_fallback(result(compression_ratio=2.5))
    assert request.needs_fallback(result(avg_logprob=-1.5))
    assert not request.needs_fallback(result(avg_logprob=-1.5, no_speech_prob=0.9))  # silence: kept as it is
    off = WindowRequest(audio=np.zeros(16000, np.float32), frames=100, compression_ratio_threshold=None,
                        logprob_threshold=None)
    assert not off.needs_fallback(result(avg_logprob=-3.0, compression_ratio=9.0))
