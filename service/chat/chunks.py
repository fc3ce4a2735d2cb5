"""ChatCompletionChunk events, encoded once per response where they can be: one reply streams hundreds of
chunks that differ only in their text, so the JSON around the text is built once and each content or
reasoning chunk is that frame around one escaped string. Anything else goes through the pydantic model."""

from __future__ import annotations

import json

from service.chat.replies import ChatCompletionChunk, ChoiceDelta, ChoiceLogprobs, ChunkChoice, FinishReason
from service.chat.stream import ResponseMeta
from service.http.sse import sse_data

__all__ = ["ChunkEncoder"]


class ChunkEncoder:
    """SSE `data:` events of one streamed chat completion (`meta` gives id, created and model)."""

    def __init__(self, meta: ResponseMeta) -> None:
        self.meta = meta
        head = json.dumps({"id": meta.id, "object": "chat.completion.chunk", "created": meta.created,
                           "model": meta.model}, ensure_ascii=False, separators=(",", ":"))
        self._head = b"data: " + head[:-1].encode() + b',"choices":[{"index":0,"delta":{"'
        self._tail = b'},"logprobs":null,"finish_reason":null}]}\n\n'

    def encode(self, delta: ChoiceDelta, finish: FinishReason | None = None,
               logprobs: ChoiceLogprobs | None = None) -> bytes:
        """One event; the same JSON object ChatCompletionChunk would give. Raises nothing."""
        if finish is None and delta.role is None and delta.tool_calls is None and logprobs is None:
            if delta.reasoning_content is None and delta.content is not None:
                return self._text(b"content", delta.content)
            if delta.content is None and delta.reasoning_content is not None:
                return self._text(b"reasoning_content", delta.reasoning_content)
        meta = self.meta
        return sse_data(ChatCompletionChunk(id=meta.id, created=meta.created, model=meta.model,
                                            choices=[ChunkChoice(delta=delta, finish_reason=finish,
                                                                 logprobs=logprobs)]))

    def _text(self, field: bytes, text: str) -> bytes:
        return self._head + field + b'":' + json.dumps(text, ensure_ascii=False).encode() + self._tail
