"""ChatCompletionChunk events, encoded once per response where they can be: one reply streams hundreds of
chunks that differ only in their text, so the JSON around the text is built once and each content or
reasoning chunk is that frame around one escaped string; log probabilities beside text are written by
service/chat/logprobs.py's LogprobJson. Anything else goes through the pydantic model."""

from __future__ import annotations

import json
from typing import Sequence

from engine.contracts import TokenLogprob
from service.chat.chunk_usage import ChunkUsage
from service.chat.logprobs import LogprobJson, chat_logprobs
from service.chat.replies import ChatCompletionChunk, ChoiceDelta, ChunkChoice, FinishReason
from service.chat.stream import ResponseMeta, UsageCounter
from service.http.sse import line_safe, sse_data

__all__ = ["ChunkEncoder"]


class ChunkEncoder:
    """SSE `data:` events of one streamed chat completion (`meta` gives id, created and model)."""

    def __init__(self, meta: ResponseMeta, logprobs: LogprobJson | None = None, usage: bool = False,
                 index: int = 0, counter: UsageCounter | None = None) -> None:
        """`logprobs`: how the stream's log probabilities are written (None: it asked for none); `usage`: a usage
        chunk ends the stream, so each of these says `"usage": null`, or the choice's usage so far from `counter`
        where `meta.continuous_usage`; `index`: the choice's (n > 1)."""
        self.meta = meta
        self.index = index
        self.logprobs = logprobs
        self._usage = ChunkUsage(usage, counter if meta.continuous_usage else None)
        head = json.dumps({"id": meta.id, "object": "chat.completion.chunk", "created": meta.created,
                           "model": meta.model}, ensure_ascii=False, separators=(",", ":"))
        self._head = b"data: " + head[:-1].encode() + b',"choices":[{"index":%d,"delta":{"' % index
        # A text chunk's end, built once unless its usage changes from chunk to chunk (the per-token path)
        self._tail = None if meta.continuous_usage and usage else \
            b'},"logprobs":null,"finish_reason":null}]' + self._usage.end()

    def encode(self, delta: ChoiceDelta, finish: FinishReason | None = None,
               logprobs: Sequence[TokenLogprob] = ()) -> bytes:
        """One event; the same JSON object ChatCompletionChunk would give (`logprobs`: the tokens whose entries
        go with it; none without a LogprobJson). Raises nothing."""
        writer = self.logprobs if logprobs else None
        if finish is None and delta.role is None and delta.tool_calls is None:
            field, text = ((b"content", delta.content) if delta.reasoning_content is None
                           else (b"reasoning_content", delta.reasoning_content) if delta.content is None else (b"", None))
            if text is not None:  # one text field alone: the frame built once
                return line_safe(self._text(field, text, writer.encode(logprobs) if writer else None))
        meta = self.meta
        entries = chat_logprobs(writer.pieces, logprobs) if writer else None
        event = sse_data(ChatCompletionChunk(id=meta.id, created=meta.created, model=meta.model,
                                             choices=[ChunkChoice(index=self.index, delta=delta, finish_reason=finish,
                                                                  logprobs=entries)]))
        # The role chunk shows nothing generated: 0 completion tokens, as vLLM's first chunk says.
        opening = delta.role is not None and not delta.content and delta.reasoning_content is None \
            and delta.tool_calls is None and delta.function_call is None and finish is None
        return self._usage.mark(event, shows_reply=not opening)

    def _text(self, field: bytes, text: str, logprobs: bytes | None) -> bytes:
        body = self._head + field + b'":' + json.dumps(text, ensure_ascii=False).encode()
        if logprobs is None:
            if self._tail is not None:
                return body + self._tail
            return body + b'},"logprobs":null,"finish_reason":null}]' + self._usage.end()
        return body + b'},"logprobs":' + logprobs + b',"finish_reason":null}]' + self._usage.end()
