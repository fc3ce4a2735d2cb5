"""include: ["message.output_text.logprobs"] on /v1/responses: each output_text part carries its tokens' log
probabilities (with top_logprobs alternatives), each streamed text delta its own, read through the openai SDK;
the thinking's and a call's tokens are not the text's (service/responses/text_logprobs.py)."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from litestar.testing import TestClient

from engine.contracts import TokenLogprob
from service.chat.logprobs import token_pieces
from service.chat.replies import ChoiceDelta
from service.responses.text_logprobs import TextTokens
from tests.service.chat.test_routes import CALL, CallingTokenizer
from tests.service.fake_engine import FakeEngine, FakeTokenizer
from tests.service.sse_events import named_events

PIECES = ["Hel", "lo", " wor", "ld", "!"]  # the fake engine's token for a piece is its first character
INCLUDE = ["message.output_text.logprobs"]


def _entry(token: str, i: int, k: int) -> dict[str, Any]:
    """The fake engine's entry for the i-th piece's token, with k alternatives (the ids after it, each 1 lower)."""
    value = -(i + 1) / 10
    top = [{"token": chr(ord(token) + j), "logprob": pytest.approx(value - j), "bytes": [ord(token) + j]}
           for j in range(k)]
    return {"token": token, "logprob": pytest.approx(value), "bytes": [ord(token)], "top_logprobs": top}


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(list(PIECES))


def test_the_output_text_carries_each_tokens_logprobs_with_top_alternatives(sdk: openai.OpenAI,
                                                                            engine: FakeEngine) -> None:
    response = sdk.responses.create(model="fake-model", input="hi", include=INCLUDE, top_logprobs=2)
    assert engine.requests[-1].sampling.logprobs == 2
    part = response.output[0].content[0]
    assert part.type == "output_text" and part.text == "".join(PIECES)
    assert [lp.model_dump() for lp in part.logprobs or ()] == [_entry(p[0], i, 2) for i, p in enumerate(PIECES)]
    assert response.top_logprobs == 2


def test_each_streamed_delta_carries_its_own_tokens_and_the_done_events_all(sdk: openai.OpenAI) -> None:
    with sdk.responses.stream(model="fake-model", input="hi", include=INCLUDE, top_logprobs=1) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = [(e.delta, [lp.model_dump(exclude_none=True) for lp in e.logprobs])
              for e in events if e.type == "response.output_text.delta"]
    assert deltas == [(p, [_entry(p[0], i, 1)]) for i, p in enumerate(PIECES)]
    every = [_entry(p[0], i, 1) for i, p in enumerate(PIECES)]
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert [lp.model_dump(exclude_none=True) for lp in done.logprobs] == every
    (part,) = [e.part for e in events if e.type == "response.content_part.done"]
    assert [lp.model_dump() for lp in part.logprobs or ()] == every
    assert [lp.model_dump() for lp in final.output[0].content[0].logprobs or ()] == every


def test_without_the_include_nothing_is_asked_of_the_engine_top_logprobs_alone_either(http: TestClient[Any],
                                                                                      engine: FakeEngine) -> None:
    # As OpenAI: top_logprobs fills each entry's alternatives only when the logprobs are included.
    for body in ({}, {"top_logprobs": 3}):
        reply = http.post("/v1/responses", json={"input": "hi", **body})
        assert reply.status_code == 200, reply.text
        assert engine.requests[-1].sampling.logprobs is None
        assert reply.json()["output"][0]["content"][0]["logprobs"] == []
        events = named_events(http.post("/v1/responses", json={"input": "hi", "stream": True, **body}).text)
        assert all(e["logprobs"] == [] for e in events if e["type"] == "response.output_text.delta")
    assert http.post("/v1/responses", json={"input": "hi", "include": INCLUDE}).status_code == 200
    assert engine.requests[-1].sampling.logprobs == 0  # each token alone, top_logprobs empty


@pytest.mark.parametrize("top", [-1, 21])
def test_top_logprobs_past_openais_range_is_refused_by_name(http: TestClient[Any], top: int) -> None:
    response = http.post("/v1/responses", json={"input": "hi", "include": INCLUDE, "top_logprobs": top})
    assert response.status_code == 400 and response.json()["error"]["param"] == "top_logprobs"


def test_the_thinkings_and_a_calls_tokens_are_not_the_texts(http: TestClient[Any], engine: FakeEngine) -> None:
    # One piece a character, so each token's bytes are the text it wrote, as the engine's are.
    engine.tokenizer = CallingTokenizer()
    engine.pieces = [*"<think>hm</think>", *"Sun", CALL]
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    for stream in (False, True):
        body = {"input": "weather?", "tools": tools, "include": INCLUDE, "stream": stream}
        response = http.post("/v1/responses", json=body)
        output = (named_events(response.text)[-1]["response"] if stream else response.json())["output"]
        assert [item["type"] for item in output] == ["reasoning", "message", "function_call"]
        assert [lp["token"] for lp in output[1]["content"][0]["logprobs"]] == ["S", "u", "n"]


def _tokens(text: str) -> list[TokenLogprob]:
    return [TokenLogprob(ord(c), -1.0, ()) for c in text]


def test_a_pieces_tokens_go_to_its_content_at_the_end_or_the_start_of_it() -> None:
    texts = TextTokens(token_pieces(FakeTokenizer()))
    assert texts.split(_tokens("</th"), []) == []  # held back: a possible marker
    # The marker's tokens then the content's: the content's are the last, as many as cover its bytes.
    split = texts.split(_tokens("ink>Hi"), [ChoiceDelta(content="Hi")])
    assert split == [_tokens("Hi")]
    # Content then a call: the first.
    split = texts.split(_tokens("ok<c>"), [ChoiceDelta(content="ok"), ChoiceDelta(tool_calls=[])])
    assert split == [_tokens("ok"), []]
    assert texts.split(_tokens("hmm"), [ChoiceDelta(reasoning_content="hmm")]) == [[]]
