"""Word timestamps after mlx-whisper's alignment (mlx_whisper.timing.add_word_timestamps): openai-whisper's score
for hallucinated words, the trailing hallucinations of a window that ends in silence, and words kept inside their
segment once both are mapped back to the source audio, and a window's words and segments kept inside the audio
it consumed.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["PUNCTUATION", "word_anomaly_score", "is_segment_anomaly", "hallucinated_tail", "nest", "within",
           "CachedAudio"]

# openai-whisper's transcribe(): words made of these alone are left out of the anomaly score
PUNCTUATION = "\"'“¿([{-\"'.。,，!！?？:：”)]}、"


def word_anomaly_score(word: dict[str, Any]) -> float:
    """openai-whisper's score of one aligned word: improbable, very short or very long words score. Raises
    nothing."""
    probability = float(word.get("probability", 0.0))
    duration = float(word["end"]) - float(word["start"])
    score = 0.0
    if probability < 0.15:
        score += 1.0
    if duration < 0.133:
        score += (0.133 - duration) * 15
    if duration > 2.0:
        score += duration - 2.0
    return score


def is_segment_anomaly(segment: dict[str, Any] | None) -> bool:
    """openai-whisper's test of a segment's first eight words (punctuation left out). Raises nothing."""
    if segment is None or not segment.get("words"):
        return False
    words = [w for w in segment["words"] if w["word"] not in PUNCTUATION][:8]
    score = sum(word_anomaly_score(w) for w in words)
    return score >= 3 or score + 0.01 >= len(words)


def hallucinated_tail(segments: Sequence[dict[str, Any]]) -> int:
    """Index of the first of the trailing segments that all score as anomalies (segments without words among
    them count with them); len(segments) when the last segment with words does not. Raises nothing."""
    cut = len(segments)
    for i in range(len(segments) - 1, -1, -1):
        if segments[i].get("words"):
            if not is_segment_anomaly(segments[i]):
                break
        cut = i
    return cut if any(s.get("words") for s in segments[cut:]) else len(segments)


def nest(start: float, end: float, lo: float, hi: float) -> tuple[float, float]:
    """[start, end] moved inside [lo, hi], start <= end kept. Raises nothing."""
    start = min(max(start, lo), hi)
    return start, min(max(end, start), hi)


def within(segments: Sequence[dict[str, Any]], lo: float, hi: float) -> None:
    """Segments and their aligned words moved inside [lo, hi] (a window's start and its seek), in place: the
    alignment may end a segment's last word past the seek, where the next window's words begin. Raises nothing."""
    for s in segments:
        s["start"], s["end"] = nest(float(s["start"]), float(s["end"]), lo, hi)
        for w in s.get("words", []):
            w["start"], w["end"] = nest(float(w["start"]), float(w["end"]), lo, hi)


class CachedAudio:
    """The model as mlx-whisper's word alignment sees it, reading the window's encoder output instead of
    encoding the mel again."""

    def __init__(self, model: Any, features: Any) -> None:
        self.dims, self.alignment_heads = model.dims, model.alignment_heads
        self._model, self._features = model, features

    def forward_with_cross_qk(self, mel: Any, tokens: Any) -> tuple[Any, Any]:
        logits, _, cross_qk = self._model.decoder(tokens, self._features)
        return logits, cross_qk
