"""Where a final live decode's text ends, when Whisper stopped writing well before the speech did (it does near a
window's end): the text up to there is kept and the rest of the speech is decoded again from there
(audio/live.py's `_final`); else its text runs to the pause, and the next utterance is decoded from there."""

from __future__ import annotations

from audio.decoding import HOP_LENGTH
from audio.pcm import SAMPLE_RATE

__all__ = ["RETRY_TAIL_S", "clamped_timestamps", "closed_at", "stopped_short"]

RETRY_TAIL_S = 1.0  # speech left after a final decode's text that is decoded again


def stopped_short(tokens: list[int], timestamp_begin: int, samples_per_timestamp: int, seek: int, limit: int,
                  forced: int = 0) -> tuple[int, int] | None:
    """(where a final decode's text ends, as a compact position, and how many of `tokens` that text is) when it
    ends more than RETRY_TAIL_S of speech before `limit` and past the seek, else None. A text ending on a timestamp
    ends there, all of it kept. After text with no closing timestamp the last timestamp opened that text: it is
    where the text is known to end, and the open segment is left out, to be decoded again from there (kept, the
    same sentence was committed again by each decode from its start: three times in one CI run). Only the sampled
    tokens, after the `forced` prefix (committed already), can say so. Raises nothing."""
    stamps = [i for i, t in enumerate(tokens) if t >= timestamp_begin]
    if not stamps or stamps[-1] < forced:
        return None
    last = stamps[-1]
    end = seek + (tokens[last] - timestamp_begin) * samples_per_timestamp
    if not seek + HOP_LENGTH < end <= limit - RETRY_TAIL_S * SAMPLE_RATE:
        return None
    return end, last + 1


def clamped_timestamps(tokens: list[int], timestamp_begin: int, last: int, forced: int = 0) -> list[int]:
    """`tokens` with every sampled timestamp (after the `forced` prefix) past `last` (the timestamp of the decoded
    audio's end) set to `last`. Over a cut context tiny.en closed a 4.8 s text at <|10.00|>, the context's end: forced
    as the next decode's prefix, that claim made Whisper write nothing for the speech after it (two utterances lost
    in one run). Raises nothing."""
    cap = timestamp_begin + max(0, last)
    return tokens[:forced] + [min(t, cap) if t >= timestamp_begin else t for t in tokens[forced:]]


def closed_at(tokens: list[int], timestamp_begin: int, last: int, forced: int = 0) -> list[int]:
    """`tokens` (a final decode's, not stopped short) with the sampled timestamp that closes its text (after the
    `forced` prefix) moved on to `last` (the timestamp of its pause): the speech up to the pause is its utterance's.
    Whisper's closing timestamp often lies before the last word ends (37.32 s, the pause at 38.1 s): the next decode,
    trimmed there or forced to go on from there, read the tail again, and the next item began with it ("5, 8 of
    spades" after "5 5."). Raises nothing."""
    if len(tokens) > max(1, forced) and tokens[-1] >= timestamp_begin > tokens[-2]:
        return tokens[:-1] + [max(tokens[-1], timestamp_begin + last)]
    return tokens
