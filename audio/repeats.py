"""Text Whisper writes twice at a live decode's boundary: a decode that ends in silence or padding, or one run
again from a timestamp that came early, repeats the sentence just before (" Ten of clubs. Ten of clubs.",
" He was not an ill-disposed young man. Ill-disposed young man.") or starts again a few words back (" how much
there might be. Much there might be prudently ..."), or from its start, cut short. The repeat is left out of the
committed text; the decoder's prefix keeps it, as that text matches the audio the next decode reads.
whisper_streaming drops such overlaps the same way (n-grams at the start of new text equal to the end of committed
text)."""

from __future__ import annotations

import re
from dataclasses import replace

from audio.transcript import Segment

__all__ = ["MIN_OVERLAP_WORDS", "MIN_WORDS", "as_committed", "committed_segments", "copies", "copied_words",
           "kept_spans", "without_repeats"]

MIN_WORDS = 2  # a repeated single word ("five. five.") may be speech: only longer sentences are dropped
MIN_OVERLAP_WORDS = 3  # words a sentence at the boundary must share with the end of the one before to lose them
_SENTENCE = re.compile(r"\s*[^.!?]*[.!?]+|\s*[^.!?]+$")
_ENDS = (".", "!", "?")


def _words(text: str) -> list[str]:
    return [w for w in (re.sub(r"[^a-z0-9']", "", raw.lower()) for raw in text.split()) if w]


def without_repeats(before: str, new: str) -> str:
    """`new` (text that follows `before` in one utterance) without each complete sentence of it whose words are the
    end of the sentence just before it — the same sentence again, or its tail — and at least MIN_WORDS long; the
    first sentence of `new` also loses leading words (at least MIN_OVERLAP_WORDS) that end the last sentence of
    `before`. A complete sentence that is the start of the one before (at least MIN_OVERLAP_WORDS) is dropped too.
    A sentence begun in `before` and ended in `new` is never touched. Raises nothing."""
    kept = _kept(before, new)
    return new if kept is None else "".join(text for _, _, text in kept)


def kept_spans(before: str, new: str) -> list[tuple[int, int]]:
    """Where in `new` the text `without_repeats(before, new)` keeps lies: [start, end) character spans, in order (a
    sentence that lost leading words starts at the space before its first kept word). Raises nothing."""
    kept = _kept(before, new)
    return [(0, len(new))] if kept is None else [(start, end) for start, end, _ in kept]


def _kept(before: str, new: str) -> list[tuple[int, int, str]] | None:
    """The sentences of `new` that without_repeats keeps, each as (start, end, its kept text) with [start, end) the
    span of `new` that text comes from; None where `new` is not a split this understands (all of it is kept).
    Raises nothing."""
    chunks = _SENTENCE.findall(new)
    if "".join(chunks) != new:  # not a split this function understands: keep the text as it is
        return None
    tail = _SENTENCE.findall(before)
    previous = _words(tail[-1]) if tail else []
    open_sentence = bool(before.strip()) and not before.rstrip().endswith(_ENDS)
    kept: list[tuple[int, int, str]] = []
    end = 0
    for i, chunk in enumerate(chunks):
        start, end = end, end + len(chunk)
        words = _words(chunk)
        if i == 0 and open_sentence:
            previous = previous + words
        elif chunk.rstrip().endswith(_ENDS) and len(words) >= MIN_WORDS and (previous[-len(words):] == words or (
                len(words) >= MIN_OVERLAP_WORDS and previous[:len(words)] == words)):
            # a repeat, or the sentence begun again and cut short: a stopped-short final's tail, re-decoded over
            # little speech, wrote its utterance's first words again ("...seven of Hearts. Eight of spades.")
            continue  # `previous` stays the sentence it repeats
        else:
            if i == 0 and len(chunk.split()) == len(words):
                overlap = max((k for k in range(MIN_OVERLAP_WORDS, len(words)) if previous[-k:] == words[:k]),
                              default=0)
                if overlap:
                    first = [m.start() for m in re.finditer(r"\S+", chunk)][overlap]
                    cut = first - (1 if chunk[:1].isspace() else 0)  # from the space before its first kept word
                    start, chunk = start + cut, chunk[cut:]  # as `new` has it: its tokens' bytes join to it
                words = words[overlap:]
            previous = words
        kept.append((start, end, chunk))
    return kept


def copies(text: str, context: str) -> bool:
    """Whether `text`'s words (case and punctuation aside) run, in order, somewhere in `context`: a decode that
    loops on text it was conditioned on ("10 of clubs 7 of clubs 7 of clubs …" after cards read aloud) writes what
    it read, not what it heard. Text without words copies nothing. Raises nothing."""
    words, seen = _words(text), _words(context)
    n = len(words)
    return n > 0 and any(seen[i:i + n] == words for i in range(len(seen) - n + 1))


def copied_words(text: str, context: str) -> int:
    """The longest run of `text`'s words (case and punctuation aside) that `context` holds in the same order.
    Raises nothing."""
    words, seen = _words(text), _words(context)
    best, row = 0, [0] * (len(seen) + 1)
    for w in words:  # longest common run, one row of the table at a time
        new = [0] * (len(seen) + 1)
        for j, v in enumerate(seen, start=1):
            if v == w:
                new[j] = row[j - 1] + 1
                best = max(best, new[j])
        row = new
    return best


def as_committed(pieces: list[str], committed: str) -> list[str]:
    """Each of `pieces` (a live transcript's segment texts in order, repeats included) as `committed` (the text
    committed from the same decodes, repeats left out) holds it: unchanged where the committed text goes on with it,
    without its repeats (`without_repeats` against the piece before) where it goes on with that, "" where that is
    nothing. A piece the committed text does not go on with either way is kept as it is. Raises nothing."""
    out: list[str] = []
    cursor, before = 0, ""
    for piece in pieces:
        rest = committed[cursor:]
        trimmed = without_repeats(before, piece)
        before = piece
        if rest.startswith(piece):
            out.append(piece)
            cursor += len(piece)
        elif not trimmed.strip():
            out.append("")
        elif rest.startswith(trimmed):
            out.append(trimmed)
            cursor += len(trimmed)
        else:
            out.append(piece)
            found = rest.find(piece)
            cursor += found + len(piece) if found >= 0 else 0
    return out


def committed_segments(segments: list[Segment], committed: str) -> list[Segment]:
    """`segments` (a live transcript's, from the decoder's prefix, which keeps repeats) each as `committed` holds
    it (`as_committed`), those left with no text dropped and the rest numbered again. Raises nothing."""
    texts = as_committed([s.text for s in segments], committed)
    return [replace(s, id=i, text=x) for i, (s, x) in enumerate((s, x) for s, x in zip(segments, texts) if x)]
