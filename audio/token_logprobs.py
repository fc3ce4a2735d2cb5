"""The log probabilities of the tokens a live session commits (OpenAI's Realtime `logprobs`: token, logprob, bytes):
each text token of a decode with the log probability its row kept when it sampled it (audio/decoder.py), its text
and its bytes from the Whisper tokenizer. The bytes are the token's own (tiktoken's), which for a token that splits a
UTF-8 character are not a whole character's: its text then shows U+FFFD where the bytes say what it is.

The entries of a piece of text join, byte for byte, to exactly that text: where the text leaves out part of a token's
(a repeat left out around it, leading whitespace stripped), the token loses the same bytes, its log probability
unchanged, and a token none of whose text is kept is left out."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

from audio.repeats import kept_spans
from audio.transcript import TokenLogprob  # a plain value type, kept with the others (re-exported)

if TYPE_CHECKING:
    from audio.window import WindowResult

__all__ = ["TokenLogprob", "token_logprobs", "aligned_logprobs", "kept_logprobs", "committed_logprobs", "less_leading",
           "less_trailing", "stripped_logprobs", "FLOOR"]

# OpenAI writes this for a probability too small to show, as chat's logprobs here do (JSON has no -Infinity): a
# token picked where the timestamp rules had masked every token (NaN: -inf less -inf) gets it too.
FLOOR = -9999.0


def token_logprobs(tokenizer: Any, tokens: Sequence[int], logprobs: Sequence[float | None],
                   spans: list[tuple[int, int]] | None = None) -> list[TokenLogprob]:
    """The text tokens of `tokens` (below the tokenizer's end of text; timestamps are no text) with their
    `logprobs` (one for each of `tokens`; a forced token's None is never a text token's here). `spans`: only what
    lies within these [start, end) character spans of the tokens' text (what audio/repeats.py kept of it), a token
    across a span's edge cut to its bytes within (a repeat's `."` keeps its `.`); None: all. Raises nothing."""
    eot = tokenizer.eot
    text = [(tokenizer.encoding.decode_single_token_bytes(t), lp) for t, lp in zip(tokens, logprobs) if t < eot]
    if spans is not None:
        text = _within(text, spans)
    out: list[TokenLogprob] = []
    for raw, lp in text:
        if lp is None:
            continue
        value = float(lp)
        out.append(TokenLogprob(raw.decode("utf-8", errors="replace"), value if math.isfinite(value) else FLOOR,
                                tuple(raw)))
    return out


# A text token's bytes and the log probability its row kept (None: forced, not sampled).
_Token = tuple[bytes, float | None]


def _within(tokens: list[_Token], spans: list[tuple[int, int]]) -> list[_Token]:
    """Each token's bytes within `spans` (characters of the tokens' joined text), tokens with none left out. Raises
    nothing."""
    joined = b"".join(raw for raw, _ in tokens)
    text = joined.decode("utf-8", errors="replace")
    if text.encode() != joined:  # not whole characters (a decode cut mid-character): by where each token starts
        return _starting_within(tokens, spans)
    edges = [(len(text[:start].encode()), len(text[:end].encode())) for start, end in spans]
    out: list[_Token] = []
    at = 0
    for raw, lp in tokens:
        kept = b"".join(raw[max(start - at, 0):max(end - at, 0)] for start, end in edges)
        if kept:
            out.append((kept, lp))
        at += len(raw)
    return out


def _starting_within(tokens: list[_Token], spans: list[tuple[int, int]]) -> list[_Token]:
    """The tokens that start within `spans` (characters of the joined text as decoded so far). Raises nothing."""
    out: list[_Token] = []
    joined = b""
    for raw, lp in tokens:
        at = len(joined.decode("utf-8", errors="replace"))
        joined += raw
        if any(start <= at < end for start, end in spans):
            out.append((raw, lp))
    return out


def less_leading(entries: Sequence[TokenLogprob], count: int) -> tuple[TokenLogprob, ...]:
    """`entries` without their first `count` bytes, as text that strips leading whitespace strips them: a token
    wholly within goes, the one they end in keeps its other bytes (and its logprob). Raises nothing."""
    i = 0
    while i < len(entries) and count >= len(entries[i].bytes):
        count -= len(entries[i].bytes)
        i += 1
    if i == len(entries) or not count:
        return tuple(entries[i:])
    rest = bytes(entries[i].bytes[count:])
    return (TokenLogprob(rest.decode("utf-8", errors="replace"), entries[i].logprob, tuple(rest)), *entries[i + 1:])


def less_trailing(entries: Sequence[TokenLogprob], count: int) -> tuple[TokenLogprob, ...]:
    """`entries` without their last `count` bytes, as less_leading cuts their first. Raises nothing."""
    i = len(entries)
    while i and count >= len(entries[i - 1].bytes):
        count -= len(entries[i - 1].bytes)
        i -= 1
    if not i or not count:
        return tuple(entries[:i])
    rest = bytes(entries[i - 1].bytes[:-count])
    return (*entries[:i - 1], TokenLogprob(rest.decode("utf-8", errors="replace"), entries[i - 1].logprob, tuple(rest)))


def stripped_logprobs(entries: Sequence[TokenLogprob], text: str) -> tuple[TokenLogprob, ...]:
    """`entries` (`text`'s) as `text.strip()` holds them (the file routes' text has no space at either end): the
    stripped bytes gone from the tokens at its ends. Raises nothing."""
    lead = len(text.encode()) - len(text.lstrip().encode())
    return less_trailing(less_leading(entries, lead), len(text.lstrip().encode()) - len(text.strip().encode()))


def aligned_logprobs(kept: Sequence[float] | None, forced: int) -> list[float | None] | None:
    """A decode's kept token log probabilities (its row's, audio/decoder.py), one for each of its tokens (None for
    its `forced` prefix's), or None where it kept none. Raises nothing."""
    return None if kept is None else [None] * forced + list(kept)


def committed_logprobs(tokenizer: Any, tokens: Sequence[int], logprobs: Sequence[float | None] | None, before: str,
                       full: str, text: str) -> tuple[TokenLogprob, ...] | None:
    """The entries of `text`, what a live session commits of `tokens` (text `full`, after text `before`): those of
    the spans audio/repeats.py kept of it, all where it kept the whole; None without `logprobs`. Raises nothing."""
    if logprobs is None:
        return None
    spans = kept_spans(before, full) if text != full else None
    return tuple(token_logprobs(tokenizer, tokens, logprobs, spans))


def kept_logprobs(result: "WindowResult") -> list[float | None] | None:
    """The log probabilities its decode kept, one for each of its tokens (None for a forced prefix's), or None
    where it kept none. Raises nothing."""
    d = result.decoded
    return aligned_logprobs(d.logprobs, len(d.tokens) - len(d.sampled))
