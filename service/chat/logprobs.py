"""Log probabilities in OpenAI's shapes: a chat choice's `logprobs.content` (each token's text, UTF-8 bytes and
log probability, with the likeliest alternatives) and a text completion's legacy lists. The engine gives token
ids and numbers (engine/contracts.py TokenLogprob); the text of one token is its tokenizer piece's bytes."""

from __future__ import annotations

import codecs
import json
import math
from typing import Any, Sequence

from engine.contracts import TokenLogprob
from engine.token_pieces import TokenPieces, token_pieces
from engine.per_tokenizer import PerTokenizer
from service.chat.replies import ChoiceLogprobs, CompletionLogprobs, LogprobEntry, TopLogprob

__all__ = ["token_pieces", "chat_logprobs", "CompletionLogprobWriter", "legacy_token", "requested_logprobs",
           "LogprobJson", "logprob_json"]

# OpenAI writes this for a probability too small to show (JSON has no -Infinity).
_FLOOR = -9999.0


def requested_logprobs(logprobs: bool | int | None, top_logprobs: int | None = None) -> int | None:
    """How many likeliest tokens the engine should report beside each sampled one (None: no log probabilities):
    chat's `logprobs: true` with `top_logprobs`, or a text completion's `logprobs: k`. Raises nothing."""
    if isinstance(logprobs, bool) or logprobs is None:
        return (top_logprobs or 0) if logprobs else None
    return logprobs


def _finite(value: float) -> float:
    return value if math.isfinite(value) else _FLOOR


class LogprobJson:
    """A chat choice's `logprobs` written straight to JSON, the same object `chat_logprobs(...).model_dump_json()`
    gives: each token's `"token"` and `"bytes"` fields are encoded once and kept (at most the vocabulary's), so a
    streamed chunk costs a join, not seven pydantic models (the event loop writes one for every token of every
    stream that asked)."""

    def __init__(self, pieces: TokenPieces) -> None:
        self.pieces = pieces
        self._parts: dict[int, tuple[bytes, bytes]] = {}

    def _part(self, token: int) -> tuple[bytes, bytes]:
        if (known := self._parts.get(token)) is not None:
            return known
        raw = self.pieces.bytes(token)
        part = (b'{"token":' + json.dumps(raw.decode("utf-8", "replace"), ensure_ascii=False).encode() + b',"logprob":',
                b',"bytes":' + json.dumps(list(raw)).encode())
        self._parts[token] = part
        return part

    def _entry(self, token: int, logprob: float) -> bytes:
        name, tail = self._part(token)
        return name + repr(_finite(logprob)).encode() + tail

    def entries(self, tokens: Sequence[TokenLogprob]) -> bytes:
        """The JSON array of these tokens' entries (`[{"token", "logprob", "bytes", "top_logprobs"}, ...]`, the
        Responses API's `logprobs` as well). Raises nothing."""
        return b"[" + b",".join(self._entry(t.token, t.logprob) + b',"top_logprobs":['
                                + b",".join(self._entry(i, v) + b"}" for i, v in t.top) + b"]}" for t in tokens) + b"]"

    def encode(self, tokens: Sequence[TokenLogprob]) -> bytes:
        """`{"content":[...],"refusal":null}` for these tokens. Raises nothing."""
        return b'{"content":' + self.entries(tokens) + b',"refusal":null}'


_JSON = PerTokenizer(lambda tokenizer: LogprobJson(token_pieces(tokenizer)))


def logprob_json(tokenizer: Any) -> LogprobJson:
    """The tokenizer's LogprobJson, built once. Raises nothing."""
    return _JSON.get(tokenizer)


def chat_logprobs(pieces: TokenPieces, tokens: Sequence[TokenLogprob]) -> ChoiceLogprobs:
    """A chat choice's `logprobs` for these tokens. Raises nothing."""
    content = []
    for t in tokens:
        raw = pieces.bytes(t.token)
        top = [TopLogprob(token=pieces.text(i), logprob=_finite(v), bytes=list(pieces.bytes(i))) for i, v in t.top]
        content.append(LogprobEntry(token=raw.decode("utf-8", "replace"), logprob=_finite(t.logprob), bytes=list(raw),
                                    top_logprobs=top))
    return ChoiceLogprobs(content=content)


def legacy_token(raw: bytes) -> str:
    """A token's name in the legacy lists: its text, or OpenAI's `bytes:\\xNN...` (printable ASCII as itself) when
    its bytes are not whole UTF-8 characters (read as text, a split character's tokens all came out U+FFFD).
    Raises nothing."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}" for b in raw)


class CompletionLogprobWriter:
    """A text completion's legacy `logprobs`, written chunk by chunk over one choice: a token's `text_offset` is the
    characters its predecessors completed (a token inside a split character starts where that character does),
    counted from `offset` (the echoed prompt's length), so offsets index the choice's text, streamed or not."""

    def __init__(self, pieces: TokenPieces, offset: int = 0, hidden: frozenset[int] = frozenset()) -> None:
        """`hidden`: the tokens the choice's text leaves out (special tokens, engine/special_tokens.py): they add
        nothing to it, so the offsets after them do not move (an echoed prompt keeps its own)."""
        self.pieces = pieces
        self.offset = offset
        self.hidden = hidden
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def _name(self, token: int) -> str:
        return legacy_token(self.pieces.bytes(token))

    def write(self, tokens: Sequence[TokenLogprob]) -> CompletionLogprobs:
        """The lists for these tokens, the next of the choice. Raises nothing."""
        out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
        for t in tokens:
            self._add(out, t.token, t.logprob, t.top, shown=t.token not in self.hidden)
        return out

    def prompt(self, tokens: Sequence[int], scored: Sequence[TokenLogprob]) -> CompletionLogprobs:
        """The echoed prompt's lists, from offset 0: its first token has no log probability (null, as OpenAI's and
        vLLM's), `scored` gives the others'. The choice's own tokens go on from `offset`. Raises nothing."""
        out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
        offset, utf8, self.offset = self.offset, self._utf8, 0
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        if tokens:
            self._add(out, tokens[0], None, ())
        for t in scored:
            self._add(out, t.token, t.logprob, t.top)
        self.offset, self._utf8 = offset, utf8
        return out

    def _add(self, out: CompletionLogprobs, token: int, logprob: float | None,
             top: Sequence[tuple[int, float]], shown: bool = True) -> None:
        raw = self.pieces.bytes(token)
        out.tokens.append(legacy_token(raw))
        out.text_offset.append(self.offset)
        if shown:
            self.offset += len(self._utf8.decode(raw))
        out.token_logprobs.append(None if logprob is None else _finite(logprob))
        if logprob is None:
            out.top_logprobs.append(None)
            return
        entries = {self._name(i): _finite(v) for i, v in top}
        # "The API will always return the logprob of the sampled token": up to logprobs + 1 entries.
        entries.setdefault(out.tokens[-1], _finite(logprob))
        out.top_logprobs.append(entries)
