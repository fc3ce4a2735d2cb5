"""audio/word_alignment.py: openai-whisper's DTW without numba, the words of a decode and their times, and the time
each token of a decode was said at."""

from __future__ import annotations

import numpy as np
import pytest

from audio.decoding import tokenizer_for
from audio.whisper import LoadedWhisper
from audio.word_alignment import AlignedWord, _cut_long, align_words, dtw, token_times


def reference_dtw(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """mlx-whisper's dtw_cpu, its loops as they are, and its backtrace (their Python, numba left out)."""
    from mlx_whisper.timing import backtrace

    n, m = x.shape
    cost = np.ones((n + 1, m + 1), dtype=np.float32) * np.inf
    trace = -np.ones((n + 1, m + 1), dtype=np.float32)
    cost[0, 0] = 0
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            cost[i, j] = x[i - 1, j - 1] + c
            trace[i, j] = t
    path = backtrace.py_func(trace)
    return path[0], path[1]


def test_the_dtw_is_openai_whispers_ties_included() -> None:
    rng = np.random.default_rng(0)
    for n, m in ((1, 1), (1, 6), (6, 1), (4, 9), (30, 200)):
        for rounded in (False, True):  # whole numbers tie often
            x = rng.normal(size=(n, m)).astype(np.float32)
            x = np.round(x) if rounded else x
            ours, theirs = dtw(x), reference_dtw(x)
            np.testing.assert_array_equal(ours[0], theirs[0])
            np.testing.assert_array_equal(ours[1], theirs[1])


def test_words_are_aligned_over_the_encoder_output(tiny_whisper: LoadedWhisper) -> None:
    import mlx.core as mx

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    text = [*tok.encode(" Ten of clubs."), *tok.encode(" Four queen.")]
    features = mx.random.normal((1, 1500, tiny_whisper.model.dims.n_audio_state), key=mx.random.key(0))
    words = align_words(tiny_whisper.model, tok, text, features, 300)
    assert [t for w in words for t in w.tokens] == text and "".join(w.word for w in words) == " Ten of clubs. Four queen."
    assert all(0 <= w.start <= w.end <= 3.0 for w in words)
    assert all(a.end <= b.start + 1e-9 for a, b in zip(words, words[1:]))
    assert align_words(tiny_whisper.model, tok, [], features, 300) == []


def test_a_token_is_said_at_its_words_middle_and_punctuation_with_the_word_before() -> None:
    words = [AlignedWord(" ten", [1], 0.0, 0.4), AlignedWord(" clubs", [2, 3], 0.4, 1.0),
             AlignedWord(".", [4], 1.0, 2.5), AlignedWord(" four", [5], 2.5, 2.9)]
    eot, seek = 100, 16000
    times = token_times(words, [200, 1, 2, 3, 4, 201, 202, 5, 203], eot, seek)
    assert times == [None, seek + 3200, seek + 11200, seek + 11200, seek + 11200, None, None, seek + 43200, None]
    assert token_times(words, [1, 2, 3], eot, seek) is None  # they do not spell the decode out
    assert token_times([], [200], eot, seek) is None


def test_a_word_stretched_over_a_pause_is_cut_as_openai_whisper_cuts_it() -> None:
    # "Unless" aligned back over the pause before it went to the sentence before: at most twice the median word
    words = [AlignedWord(" Four", [1], 0.0, 2.0), AlignedWord(" man", [2], 2.0, 2.3), AlignedWord(".", [3], 2.3, 3.5),
             AlignedWord(" Unless", [4], 3.5, 5.0), AlignedWord(" to", [5], 5.0, 5.2), AlignedWord(" be", [6], 5.2, 5.5),
             AlignedWord(" so", [7], 5.5, 5.8)]
    cut = _cut_long(words)  # the median word: 0.3 s
    expected = [(1.4, 2.0), (2.0, 2.3), (2.3, 2.9), (4.4, 5.0), (5.0, 5.2), (5.2, 5.5), (5.5, 5.8)]
    assert [(w.start, w.end) for w in cut] == [pytest.approx(e) for e in expected]
    assert _cut_long([]) == [] and _cut_long(words[1:2]) == words[1:2]
