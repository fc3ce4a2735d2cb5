"""LocalAgreement-2 over Whisper tokens: live text that is committed once two consecutive decodes agree.

The open audio (after the transcription's seek) is re-decoded as it grows. Tokens already committed in it
are forced at the start of the next decode (a decoder prefix), so every hypothesis starts with the committed
text and the rest — the continuation — is all that can change. Two consecutive continuations' longest common
prefix, cut back to a word boundary, is committed — less its last word when it is all the newer decode wrote (a word
at the audio's edge, often given a sentence end it does not have). Once committed tokens hold a complete segment (a pair of
timestamps), the audio up to that segment's end is finished: the caller trims there and the prefix moves with
it (its timestamps shifted to the new window start).
"""

from __future__ import annotations

from typing import Any

__all__ = ["LiveText", "common_prefix", "last_boundary"]


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
    """Committed tokens of the open audio (`prefix`) and the previous continuation after them."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.prefix: list[int] = []
        self.previous: list[int] | None = None
        self._starts: dict[int, bool] = {}

    def starts_word(self, token: int) -> bool:
        """Timestamps and specials, and text tokens that begin with white space, start a word. Raises nothing."""
        hit = self._starts.get(token)
        if hit is None:
            hit = token >= self.tokenizer.eot or self.tokenizer.decode([token])[:1].isspace()
            self._starts[token] = hit
        return hit

    def agree(self, continuation: list[int]) -> int:
        """How many leading tokens of `continuation` (the decode after the forced prefix) to commit: the common
        prefix with the previous continuation, cut back so the next token of both starts a new word. Records
        the uncommitted rest as the previous continuation. Raises nothing."""
        previous = self.previous
        n = 0
        if previous is not None:
            n = common_prefix(previous, continuation, self.tokenizer.timestamp_begin)
            while n > 0 and not (n < len(continuation) and n < len(previous)
                                 and self.starts_word(continuation[n]) and self.starts_word(previous[n])):
                n -= 1
            eot = self.tokenizer.eot
            if n and not any(t < eot for t in continuation[n:]):
                # The agreed text is all the newer decode wrote: its last word, at the audio's edge, waits for a
                # decode that writes on after it (two guesses ending "might be." committed a period mid-sentence).
                n = max((j for j in range(n) if continuation[j] < eot and self.starts_word(continuation[j])),
                        default=0)
        self.prefix.extend(continuation[:n])
        self.previous = continuation[n:]
        return n

    def boundary(self) -> int:
        """last_boundary of the committed prefix. Raises nothing."""
        return last_boundary(self.prefix, self.tokenizer.timestamp_begin)

    def trim(self, count: int, shift: int) -> None:
        """The first `count` prefix tokens were finished; timestamps of the rest (and of the previous
        continuation) move back by `shift` timestamp steps. Raises nothing."""
        ts = self.tokenizer.timestamp_begin

        def moved(tokens: list[int]) -> list[int]:
            return [max(ts, t - shift) if t >= ts else t for t in tokens]

        self.prefix = moved(self.prefix[count:])
        if self.previous is not None:
            self.previous = moved(self.previous)

    def reset(self) -> None:
        """Everything open was finished: nothing forced, no previous hypothesis. Raises nothing."""
        self.prefix, self.previous = [], None
