"""ChunkEncoder: the frame built once per response, and log probabilities written directly, give the same JSON
object as the pydantic chunk."""

from __future__ import annotations

import json

import pytest

from engine.contracts import TokenLogprob
from service.chat.chunks import ChunkEncoder
from service.chat.logprobs import LogprobJson, chat_logprobs
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


class Pieces:
    """Token pieces of a made-up vocabulary: ids 0–4 are whole characters, 5 half of one (its bytes alone are no
    UTF-8: the text shows U+FFFD)."""

    TABLE = {0: "a".encode(), 1: ' "q"'.encode(), 2: "é".encode(), 3: "🙂".encode(), 4: "\n".encode(),
             5: "é".encode()[:1]}

    def bytes(self, token: int) -> bytes:
        return self.TABLE[token]

    def text(self, token: int) -> str:
        return self.bytes(token).decode("utf-8", "replace")


LOGPROBS = [
    TokenLogprob(0, -0.25, ((0, -0.25), (2, -1.5), (5, float("-inf")))),
    TokenLogprob(3, -1e-7, ()),
    TokenLogprob(5, float("-inf"), ((1, -2.0),)),
    TokenLogprob(4, -3.0, ((4, -3.0), (3, -12.345678901234567))),
]


@pytest.mark.parametrize("count", [1, 2, 4])
@pytest.mark.parametrize("delta,finish", [
    (ChoiceDelta(content="a🙂"), None),
    (ChoiceDelta(reasoning_content="think"), None),
    (ChoiceDelta(), "stop"),
    (ChoiceDelta(role="assistant", content=""), None),
])
def test_log_probabilities_written_directly_match_the_model(count: int, delta: ChoiceDelta, finish) -> None:
    # Text chunks take the direct path (LogprobJson), the others the pydantic model: the same JSON object either way.
    meta = ResponseMeta(model="m")
    pieces = Pieces()
    tokens = LOGPROBS[:count]
    encoder = ChunkEncoder(meta, LogprobJson(pieces))  # type: ignore[arg-type]
    expected = ChatCompletionChunk(id=meta.id, created=meta.created, model=meta.model,
                                   choices=[ChunkChoice(delta=delta, finish_reason=finish,
                                                        logprobs=chat_logprobs(pieces, tokens))])  # type: ignore[arg-type]
    got = decode(encoder.encode(delta, finish, tokens))
    assert got == json.loads(expected.model_dump_json())
    assert got["choices"][0]["logprobs"]["content"][0]["token"] == pieces.text(tokens[0].token)
    # Twice: the kept fragments write the same.
    assert decode(encoder.encode(delta, finish, tokens)) == got
    # No tokens: no entries, as without log probabilities.
    assert decode(encoder.encode(delta, finish)) == pydantic_event(meta, delta, finish)
