"""service/chat/logprobs.py: log probabilities asked for reach the engine and come back in OpenAI's shapes — a chat
choice's `logprobs.content` (streamed on the chunk whose text the token wrote), a text completion's legacy lists —
with each token's text from its tokenizer piece (tests/engine/test_token_pieces.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.conftest import sse_events
from tests.service.fake_engine import FakeEngine

USER = [{"role": "user", "content": "hi"}]
PIECES = ["Hel", "lo", " wor", "ld", "!"]  # the fake engine's reply; each piece's token is its first character


def _entry(token: str, i: int, k: int) -> dict[str, Any]:
    value = -(i + 1) / 10
    top = [{"token": chr(ord(token) + j), "logprob": pytest.approx(value - j), "bytes": list(chr(ord(token) + j).encode())}
           for j in range(k)]
    return {"token": token, "logprob": pytest.approx(value), "bytes": list(token.encode()), "top_logprobs": top}


def test_chat_logprobs_reach_the_engine_and_come_back_per_token(client: Any, fake_engine: FakeEngine) -> None:
    body = {"model": "fake-model", "messages": USER, "logprobs": True, "top_logprobs": 2}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert fake_engine.requests[-1].sampling.logprobs == 2
    choice = response.json()["choices"][0]
    assert choice["logprobs"]["content"] == [_entry(p[0], i, 2) for i, p in enumerate(PIECES)]

    events = sse_events(client.post("/v1/chat/completions", json={**body, "stream": True}).text)[:-1]
    carried = [(e["choices"][0]["delta"].get("content"), e["choices"][0]["logprobs"]) for e in events]
    assert carried[0] == ("", None)  # the role chunk
    texts = [(text, lp["content"]) for text, lp in carried[1:] if lp is not None]
    assert texts == [(p, [_entry(p[0], i, 2)]) for i, p in enumerate(PIECES)]


def test_without_logprobs_nothing_is_computed_or_sent(client: Any, fake_engine: FakeEngine) -> None:
    response = client.post("/v1/chat/completions", json={"messages": USER, "logprobs": False})
    assert response.json()["choices"][0]["logprobs"] is None
    assert fake_engine.requests[-1].sampling.logprobs is None
    events = sse_events(client.post("/v1/chat/completions", json={"messages": USER, "stream": True}).text)[:-1]
    assert all(e["choices"][0]["logprobs"] is None for e in events)


def test_logprobs_without_top_give_each_token_alone(client: Any, fake_engine: FakeEngine) -> None:
    response = client.post("/v1/chat/completions", json={"messages": USER, "logprobs": True})
    assert fake_engine.requests[-1].sampling.logprobs == 0
    content = response.json()["choices"][0]["logprobs"]["content"]
    assert [e["top_logprobs"] for e in content] == [[]] * len(PIECES)


def test_completion_logprobs_in_the_legacy_shape_with_text_offsets(client: Any, fake_engine: FakeEngine) -> None:
    response = client.post("/v1/completions", json={"prompt": "x", "logprobs": 1})
    assert response.status_code == 200, response.text
    assert fake_engine.requests[-1].sampling.logprobs == 1
    logprobs = response.json()["choices"][0]["logprobs"]
    assert logprobs["tokens"] == [p[0] for p in PIECES]
    assert logprobs["token_logprobs"] == pytest.approx([-(i + 1) / 10 for i in range(len(PIECES))])
    assert logprobs["top_logprobs"] == [{p[0]: pytest.approx(-(i + 1) / 10)} for i, p in enumerate(PIECES)]
    assert logprobs["text_offset"] == [0, 1, 2, 3, 4]  # where each token's text starts (here one character each)

    events = sse_events(client.post("/v1/completions", json={"prompt": "x", "logprobs": 0, "stream": True}).text)[:-1]
    streamed = [e["choices"][0]["logprobs"] for e in events if e["choices"][0]["text"]]
    assert [lp["text_offset"] for lp in streamed] == [[0], [1], [2], [3], [4]]
