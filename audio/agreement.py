"""LocalAgreement-n over Whisper tokens: live text that is committed once `need` consecutive decodes agree (two by
default; a Realtime session's `delay` sets it, one to four).

The open audio (after the transcription's seek) is re-decoded as it grows. Tokens already committed in it
are forced at the start of the next decode (a decoder prefix), so every hypothesis starts with the committed
text and the rest — the continuation — is all that can change. The longest prefix the last `need` continuations
share, cut back to a word boundary, is committed — less its last word when it is all the newest decode wrote (a word
at the audio's edge, often given a sentence end it does not have; with `need` 1, every decode's last word waits so).
Once committed tokens hold a complete segment (a pair of
timestamps), the audio up to that segment's end is finished: the caller trims there and the prefix moves with
it (its timestamps shifted to the new window start).
"""

from __future__ import annotations

from typing import Any

__all__ = ["LiveText", "common_prefix", "last_boundary", "MOST_DECODES"]

MOST_DECODES = 4  # the most decodes that may be asked to agree


def common_prefix(a: list[int], b: list[int], timestamp_begin: int) -> int:
    """Length of the common prefix; any two timestamp tokens count as equal (their values jitter between
    decodes of a growing window; the structure is what must agree). Raises nothing."""
    n = 0
    for x, y in zip(a, b):
        if x != y and not (x >= timestamp_begin and y >= timestamp_begin):
            break
        n += 1
    return n


def last_boundary(tokens: list[int], timestamp_begin: int) -> int:
    """Index j such that tokens[:j] are complete segments: the end when the last segment is closed by a
    timestamp after text, else the second token of the last consecutive timestamp pair; 0 when there is
    none. Raises nothing."""
    if len(tokens) >= 2 and tokens[-1] >= timestamp_begin > tokens[-2]:
        return len(tokens)
    for j in range(len(tokens) - 1, 0, -1):
        if tokens[j] >= timestamp_begin and tokens[j - 1] >= timestamp_begin:
            return j
    return 0


class LiveText:
    """Committed tokens of the open audio (`prefix`) and the latest continuations after them (`history`, oldest
    first: the uncommitted rest of each)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.prefix: list[int] = []
        self.history: list[list[int]] = []
        self._starts: dict[int, bool] = {}

    @property
    def previous(self) -> list[int] | None:
        """The newest continuation's uncommitted rest (None: none since the last reset). Raises nothing."""
        return self.history[-1] if self.history else None

    @previous.setter
    def previous(self, tokens: list[int] | None) -> None:
        self.history = [] if tokens is None else [tokens]

    def starts_word(self, token: int) -> bool:
        """Timestamps and specials, and text tokens that begin with white space, start a word. Raises nothing."""
        hit = self._starts.get(token)
        if hit is None:
            hit = token >= self.tokenizer.eot or self.tokenizer.decode([token])[:1].isspace()
            self._starts[token] = hit
        return hit

    def agreed(self, continuation: list[int], need: int = 2) -> int:
        """How many leading tokens of `continuation` (the decode after the forced prefix) `need` consecutive decodes
        agree on, it and the `need` - 1 before it: their common prefix, cut back so the next token of each starts a
        new word; 0 while fewer decodes came. Changes nothing. Raises nothing."""
        others = self.history[-(need - 1):] if need > 1 else []
        if len(others) < need - 1:
            return 0
        n = len(continuation)
        for other in others:
            n = min(n, common_prefix(other, continuation, self.tokenizer.timestamp_begin))
        while n > 0 and not (n < len(continuation) and self.starts_word(continuation[n])
                             and all(n < len(o) and self.starts_word(o[n]) for o in others)):
            n -= 1
        eot = self.tokenizer.eot
        if n and not any(t < eot for t in continuation[n:]):
            # The agreed text is all the newer decode wrote: its last word, at the audio's edge, waits for a
            # decode that writes on after it (two guesses ending "might be." committed a period mid-sentence).
            n = max((j for j in range(n) if continuation[j] < eot and self.starts_word(continuation[j])), default=0)
        return n

    def take(self, continuation: list[int], n: int) -> None:
        """Commit the first `n` tokens of `continuation` (as `agreed` gave them, or fewer) and record its rest as the
        newest hypothesis (the `MOST_DECODES` - 1 newest are kept, those that hold the committed tokens). Raises
        nothing."""
        ts = self.tokenizer.timestamp_begin
        self.prefix.extend(continuation[:n])
        self.history = [h[n:] for h in self.history[-(MOST_DECODES - 2):] if common_prefix(h, continuation, ts) >= n]
        self.history.append(continuation[n:])

    def agree(self, continuation: list[int], need: int = 2) -> int:
        """`agreed`, then `take` what agrees. Returns its length. Raises nothing."""
        n = self.agreed(continuation, need)
        self.take(continuation, n)
        return n

    def boundary(self) -> int:
        """last_boundary of the committed prefix. Raises nothing."""
        return last_boundary(self.prefix, self.tokenizer.timestamp_begin)

    def trim(self, count: int, shift: int) -> None:
        """The first `count` prefix tokens were finished; timestamps of the rest (and of the hypotheses) move back
        by `shift` timestamp steps. Raises nothing."""
        ts = self.tokenizer.timestamp_begin

        def moved(tokens: list[int]) -> list[int]:
            return [max(ts, t - shift) if t >= ts else t for t in tokens]

        self.prefix = moved(self.prefix[count:])
        self.history = [moved(h) for h in self.history]

    def reset(self) -> None:
        """Everything open was finished: nothing forced, no hypothesis. Raises nothing."""
        self.prefix, self.history = [], []
