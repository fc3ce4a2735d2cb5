"""POST /v1/completions against a scripted engine: text and token prompts, stream grammar, echo."""

from __future__ import annotations

from typing import Any

from tests.service.conftest import sse_events
from tests.service.fake_engine import FakeEngine


def test_text_prompt_non_stream(client: Any, fake_engine: FakeEngine) -> None:
    response = client.post("/v1/completions", json={"model": "fake-model", "prompt": "abc", "max_tokens": 10})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "Hello world!"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8,
                             "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0}}
    assert fake_engine.requests[-1].prompt_tokens == [ord("a"), ord("b"), ord("c")]


def test_token_prompt_and_list_of_one_string(client: Any, fake_engine: FakeEngine) -> None:
    assert client.post("/v1/completions", json={"prompt": [5, 6, 7]}).status_code == 200
    assert fake_engine.requests[-1].prompt_tokens == [5, 6, 7]
    assert client.post("/v1/completions", json={"prompt": ["xy"]}).status_code == 200
    assert fake_engine.requests[-1].prompt_tokens == [ord("x"), ord("y")]


def test_default_max_tokens_is_16(client: Any, fake_engine: FakeEngine) -> None:
    client.post("/v1/completions", json={"prompt": "a"})
    assert fake_engine.requests[-1].max_tokens == 16


def test_max_completion_tokens_limits_a_completion_as_on_chat(client: Any, fake_engine: FakeEngine) -> None:
    # mlx_lm.server reads it on /v1/completions too; beside max_tokens (aiperf sends both) the smaller stops the reply.
    assert client.post("/v1/completions", json={"prompt": "a", "max_completion_tokens": 3}).status_code == 200
    assert fake_engine.requests[-1].max_tokens == 3
    for limits, limit in (((2, 3), 2), ((5, 4), 4)):
        both = client.post("/v1/completions", json={"prompt": "a", "max_tokens": limits[0],
                                                     "max_completion_tokens": limits[1]})
        assert both.status_code == 200 and fake_engine.requests[-1].max_tokens == limit, both.text
    scored = client.post("/v1/completions", json={"prompt": "a", "max_tokens": 3, "max_completion_tokens": 0,
                                                  "echo": True})
    assert scored.status_code == 200 and scored.json()["choices"][0]["text"] == "a", scored.text  # 0: the prompt alone


def test_stream_grammar(client: Any) -> None:
    events = sse_events(client.post("/v1/completions", json={
        "prompt": "abc", "stream": True, "stream_options": {"include_usage": True}, "echo": True}).text)
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    chunks = events[:-2]
    assert all("usage" in c and c["usage"] is None for c in chunks)
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]]
    assert finishes == ["stop"] and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert "".join(c["choices"][0]["text"] for c in chunks) == "abcHello world!"


def test_stream_error_after_headers(client: Any, fake_engine: FakeEngine) -> None:
    fake_engine.fail_with = "bad step"
    events = sse_events(client.post("/v1/completions", json={"prompt": "abc", "stream": True}).text)
    assert events[-1] == "[DONE]" and events[-2]["error"]["message"] == "bad step"


def test_a_completion_continues_its_prompt_and_a_chat_reply_does_not(client: Any, fake_engine: FakeEngine) -> None:
    # the engine keeps the first token's leading space for a continuation: "1, 2, 3," + " 4, 5,"
    assert client.post("/v1/completions", json={"prompt": "1, 2, 3,"}).status_code == 200
    assert fake_engine.requests[-1].continuation
    assert client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}).status_code == 200
    assert not fake_engine.requests[-1].continuation
