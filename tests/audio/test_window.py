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


def test_a_short_run_repeated_three_times_loops() -> None:
    from audio.window import loops

    five, dot, comma, of, clubs = 2154, 13, 11, 286, 9435
    assert loops([five, dot] * 3) and loops([7] * 3) and loops([1, 2, 3, of, clubs, 9] * 3 + [4])
    assert not loops([five, comma, five, dot])  # "Five, five." as said
    assert not loops([7, of, clubs, dot, 10, of, clubs, dot])  # a pattern, no run
    assert not loops([five, dot] * 2) and not loops(list(range(1, 18)) * 3)  # a run longer than sixteen tokens
    sentence = [679, 373, 407, 281, 4450, 12, 6381, 1775, 1862, 582, 13]  # " He was not an ill-disposed young man."
    assert loops(sentence * 3) and not loops(sentence * 2 + [679, 373])


def test_a_run_said_twice_then_mostly_again_loops() -> None:
    # The decode stopped in its third copy: " ill-disposed young man, unless to be" twice, then " ill-disposed young
    # man." (seen at 4× real time on this CPU). A short run or a sentence said twice with a few words of a third does not.
    from audio.window import loops

    run = [4450, 12, 6381, 1775, 1862, 582, 11, 4556, 284, 307]  # " ill-disposed young man, unless to be"
    assert loops([679, 373, 407, 281] + run * 2 + run[:6] + [13])
    assert not loops([679, 373, 407, 281] + run * 2 + run[:4] + [13])  # less than half of a third copy
    assert not loops([2154, 11, 2154, 13, 2154])  # "Five, five. Five": a short run
    assert not loops(run + [13] + run[:5] + [13])  # once, then part of it once more


def test_where_a_loop_starts_and_how_long_its_run_is() -> None:
    # What a live guess that loops still shows: the text before the loop and one copy of its run.
    from audio.window import loop_at

    five, dot, comma = 2154, 13, 11
    assert loop_at([five, comma, five, dot] * 3) == (0, 4)  # " 5, 5." said once, looped
    assert loop_at([40, 41] + [five] * 5) == (2, 1)
    assert loop_at([five, comma, five, dot]) is None
