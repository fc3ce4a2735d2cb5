"""ChunkEncoder: the frame built once per response gives the same JSON object as the pydantic chunk."""

from __future__ import annotations

import json

import pytest

from service.chat.chunks import ChunkEncoder
from service.chat.replies import ChatCompletionChunk, ChoiceDelta, ChunkChoice, ToolCallDelta
from service.chat.stream import ResponseMeta

TEXTS = ["", "Hello", ' "quoted" \\ back\\slash', "line\nbreak\ttab\r", "日本語 café 🙂", "\u2028\u0000\x1f", "}]{["]


def pydantic_event(meta: ResponseMeta, delta: ChoiceDelta, finish=None) -> dict:
    chunk = ChatCompletionChunk(id=meta.id, created=meta.created, model=meta.model,
                                choices=[ChunkChoice(delta=delta, finish_reason=finish)])
    return json.loads(chunk.model_dump_json())


def decode(event: bytes) -> dict:
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    return json.loads(event[len(b"data: "):])


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("field", ["content", "reasoning_content"])
def test_text_chunks_match_the_model(text: str, field: str) -> None:
    meta = ResponseMeta(model='org/"odd" model ✓')
    delta = ChoiceDelta(**{field: text})
    assert decode(ChunkEncoder(meta).encode(delta)) == pydantic_event(meta, delta)


@pytest.mark.parametrize("delta,finish", [
    (ChoiceDelta(role="assistant", content=""), None),
    (ChoiceDelta(), "stop"),
    (ChoiceDelta(content="last"), "length"),
    (ChoiceDelta(tool_calls=[ToolCallDelta(index=0, id="call_1", type="function",
                                           function={"name": "read", "arguments": "{}"})]), None),
])
def test_other_chunks_go_through_the_model(delta: ChoiceDelta, finish) -> None:
    meta = ResponseMeta(model="m")
    assert decode(ChunkEncoder(meta).encode(delta, finish)) == pydantic_event(meta, delta, finish)
