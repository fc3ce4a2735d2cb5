"""Word error rate for speech quality (tests and bench/speech.py): normalisation as shared/audio/README.md asks."""

from __future__ import annotations

import re

__all__ = ["normalize", "word_errors", "wer"]

_ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen " \
        "seventeen eighteen nineteen".split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_ABBREVIATIONS = {"mr": "mister", "mrs": "missus", "dr": "doctor", "st": "saint"}


def _number(n: int) -> str:
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    if n < 1000:
        rest = n % 100
        return _ONES[n // 100] + " hundred" + ("" if rest == 0 else " " + _number(rest))
    return " ".join(_ONES[int(d)] for d in str(n))


def normalize(text: str) -> list[str]:
    """Lower case, numbers as words, abbreviations spelled out, punctuation removed."""
    text = text.lower().replace("-", " ")
    text = re.sub(r"\d+", lambda m: " " + _number(int(m.group())) + " ", text)
    words = re.sub(r"[^a-z' ]+", " ", text).replace("'", "").split()
    return [_ABBREVIATIONS.get(w, w) for w in words]


def word_errors(reference: list[str], hypothesis: list[str]) -> int:
    """Levenshtein distance over words (substitutions, insertions, deletions)."""
    row = list(range(len(hypothesis) + 1))
    for i, r in enumerate(reference, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hypothesis, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


def wer(references: list[str], hypotheses: list[str]) -> float:
    """Corpus WER: total word errors over total reference words."""
    refs = [normalize(r) for r in references]
    errors = sum(word_errors(r, normalize(h)) for r, h in zip(refs, hypotheses))
    return errors / max(1, sum(len(r) for r in refs))
