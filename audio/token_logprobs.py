"""The log probabilities of the tokens a live session commits (OpenAI's Realtime `logprobs`: token, logprob, bytes):
each text token of a decode with the log probability its row kept when it sampled it (audio/decoder.py), its text
and its bytes from the Whisper tokenizer. The bytes are the token's own (tiktoken's), which for a token that splits a
UTF-8 character are not a whole character's: its text then shows U+FFFD where the bytes say what it is."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["TokenLogprob", "token_logprobs", "FLOOR"]

# OpenAI writes this for a probability too small to show, as chat's logprobs here do (JSON has no -Infinity): a
# token picked where the timestamp rules had masked every token (NaN: -inf less -inf) gets it too.
FLOOR = -9999.0


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    bytes: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"token": self.token, "logprob": self.logprob, "bytes": list(self.bytes)}


def token_logprobs(tokenizer: Any, tokens: Sequence[int], logprobs: Sequence[float | None],
                   spans: list[tuple[int, int]] | None = None) -> list[TokenLogprob]:
    """The text tokens of `tokens` (below the tokenizer's end of text; timestamps are no text) with their
    `logprobs` (one for each of `tokens`; a forced token's None is never a text token's here). `spans`: only the
    tokens that start within these [start, end) character spans of the tokens' text (what audio/repeats.py kept of
    it); None: all. Raises nothing."""
    eot = tokenizer.eot
    out: list[TokenLogprob] = []
    text = b""  # the text tokens' bytes so far
    for t, lp in zip(tokens, logprobs):
        if t >= eot or lp is None:
            continue
        raw = tokenizer.encoding.decode_single_token_bytes(t)
        if spans is not None:
            at = len(text.decode("utf-8", errors="replace"))  # where its text starts (as the joined text reads)
            text += raw
            if not any(start <= at < end for start, end in spans):
                continue
        value = float(lp)
        out.append(TokenLogprob(raw.decode("utf-8", errors="replace"), value if math.isfinite(value) else FLOOR,
                                tuple(raw)))
    return out
