"""audio/word_timing.py: openai-whisper's anomaly score for aligned words, the trailing hallucinations of a window,
words kept inside their segment."""

from __future__ import annotations

from typing import Any

from audio.word_timing import hallucinated_tail, is_segment_anomaly, nest, word_anomaly_score


def word(text: str, start: float, end: float, probability: float = 0.9) -> dict[str, Any]:
    return {"word": text, "start": start, "end": end, "probability": probability}


def segment(*words: dict[str, Any]) -> dict[str, Any]:
    return {"words": list(words)}


# The tail the probe found after "Seven of Hearts." at the end of its file: the aligner had no audio left for it.
INVENTED = segment(word(" Seven", 85.6, 86.16, 0.0), word(" of", 86.16, 86.16, 0.02),
                   word(" Clothes.", 86.16, 86.16, 0.01))
SAID = segment(word(" Seven", 84.96, 85.06, 0.99), word(" of", 85.06, 85.26), word(" Hearts.", 85.26, 85.6, 0.97))


def test_the_score_is_openai_whispers() -> None:
    assert word_anomaly_score(word(" of", 1.0, 1.2)) == 0.0
    assert word_anomaly_score(word(" of", 1.0, 1.2, 0.1)) == 1.0
    assert abs(word_anomaly_score(word(" of", 1.0, 1.0)) - 0.133 * 15) < 1e-9
    assert abs(word_anomaly_score(word(" of", 1.0, 3.5)) - 0.5) < 1e-9


def test_segments_of_improbable_or_instant_words_are_anomalies() -> None:
    assert is_segment_anomaly(INVENTED) and not is_segment_anomaly(SAID)
    assert not is_segment_anomaly(None) and not is_segment_anomaly(segment())
    # punctuation alone is left out; one improbable word is an anomaly of one word
    assert not is_segment_anomaly(segment(word(" Yes", 1.0, 1.3), word("?", 1.3, 1.3, 0.0)))
    assert is_segment_anomaly(segment(word(" Yes", 1.0, 1.3, 0.1)))


def test_only_a_trailing_run_of_anomalies_is_cut() -> None:
    empty: dict[str, Any] = {"words": []}
    assert hallucinated_tail([SAID, INVENTED]) == 1
    assert hallucinated_tail([INVENTED]) == 0
    assert hallucinated_tail([SAID, INVENTED, empty]) == 1
    assert hallucinated_tail([INVENTED, SAID]) == 2  # speech after it: nothing cut
    assert hallucinated_tail([SAID, empty]) == 2
    assert hallucinated_tail([]) == 0


def test_nest_keeps_a_span_inside_another() -> None:
    assert nest(31.87, 33.49, 32.83, 38.71) == (32.83, 33.49)
    assert nest(407.02, 408.42, 404.82, 407.87) == (407.02, 407.87)
    assert nest(5.0, 4.0, 0.0, 10.0) == (5.0, 5.0)
    assert nest(12.0, 13.0, 0.0, 10.0) == (10.0, 10.0)
