"""POST /v1/chat/completions against a scripted engine: stream grammar, prompt building, cancellation."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from litestar.testing import TestClient
from mlx_lm.tool_parsers import json_tools
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk as SDKChunk

from service.app import create_app
from service.config import ServiceConfig
from service.state import AppState
from tests.service.asgi import ASGIClient, asgi_scope
from tests.service.conftest import sse_events
from tests.service.fake_engine import FakeEngine, FakeTokenizer

USER = [{"role": "user", "content": "hi"}]


def _post(client: Any, **body: Any) -> Any:
    return client.post("/v1/chat/completions", json={"model": "fake-model", "messages": USER, **body})


def test_stream_grammar_with_usage(client: Any) -> None:
    response = _post(client, stream=True, stream_options={"include_usage": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    finishes = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is not None]
    assert len(finishes) == 1 and finishes[0]["choices"][0]["finish_reason"] == "stop"
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and chunks[-2] is finishes[0]
    assert all("usage" in c and c["usage"] is None for c in chunks[:-1])  # as OpenAI's: null before the usage chunk
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "Hello world!"
    assert usage_chunk["usage"]["completion_tokens"] == 5
    assert usage_chunk["usage"]["prompt_tokens"] == len("<user>hi<assistant>")
    assert usage_chunk["usage"]["total_tokens"] == 5 + len("<user>hi<assistant>")
    assert usage_chunk["usage"]["prompt_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 0}


def test_stream_without_usage_has_no_usage_chunk(client: Any) -> None:
    events = sse_events(_post(client, stream=True).text)
    assert events[-1] == "[DONE]"
    assert all(e["choices"] for e in events[:-1])
    assert all("usage" not in e for e in events[:-1])


def test_length_finish_when_max_tokens_reached(client: Any, fake_engine: FakeEngine) -> None:
    events = sse_events(_post(client, stream=True, max_tokens=2).text)
    finishes = [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"][0]["finish_reason"]]
    assert finishes == ["length"]
    assert fake_engine.requests[-1].max_tokens == 2


def test_non_stream_completion_with_usage(client: Any) -> None:
    response = _post(client)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello world!"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 5
    assert body["usage"]["prompt_tokens"] == len("<user>hi<assistant>")


def test_max_tokens_defaults_to_remaining_context(client: Any, fake_engine: FakeEngine) -> None:
    _post(client)
    prompt = len(fake_engine.requests[-1].prompt_tokens)
    assert fake_engine.requests[-1].max_tokens == fake_engine.context_length - prompt


def test_sampling_and_stop_are_passed_to_the_engine(client: Any, fake_engine: FakeEngine) -> None:
    _post(client, temperature=0.3, top_p=0.9, top_k=5, min_p=0.1, seed=7, stop="wor", presence_penalty=0.5,
          frequency_penalty=0.25, repetition_penalty=1.1, logit_bias={"65": -100})
    request = fake_engine.requests[-1]
    s = request.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.seed) == (0.3, 0.9, 5, 0.1, 7)
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (0.5, 0.25, 1.1)
    assert s.logit_bias == {65: -100.0}
    assert list(request.stop) == ["wor"]


def test_mlx_lm_servers_penalty_windows_reach_the_engine_and_are_checked(client: Any, fake_engine: FakeEngine) -> None:
    # Left out: None, OpenAI's whole-reply penalties; given (0 included: all tokens, as mlx-lm), the engine's windows.
    _post(client, repetition_penalty=1.2)
    s = fake_engine.requests[-1].sampling
    assert (s.repetition_context_size, s.presence_context_size, s.frequency_context_size) == (None, None, None)
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/completions", {"prompt": "hi"})):
        windows = {"repetition_context_size": 20, "presence_context_size": 0, "frequency_context_size": 64}
        assert client.post(path, json={**body, "presence_penalty": 0.5, **windows}).status_code == 200
        s = fake_engine.requests[-1].sampling
        assert (s.repetition_context_size, s.presence_context_size, s.frequency_context_size) == (20, 0, 64)
        for name in windows:
            refused = client.post(path, json={**body, name: -1})
            assert refused.status_code == 400 and refused.json()["error"]["param"] == name, refused.text


def test_mlx_lm_servers_xtc_fields_reach_the_engine_and_are_checked(client: Any, fake_engine: FakeEngine) -> None:
    _post(client)
    s = fake_engine.requests[-1].sampling
    assert (s.xtc_probability, s.xtc_threshold) == (0.0, 0.1)  # mlx_lm.server's defaults: off
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/completions", {"prompt": "hi"})):
        assert client.post(path, json={**body, "xtc_probability": 0.5, "xtc_threshold": 0.2}).status_code == 200
        s = fake_engine.requests[-1].sampling
        assert (s.xtc_probability, s.xtc_threshold) == (0.5, 0.2)
        for name, bad in (("xtc_probability", 1.2), ("xtc_probability", -0.5), ("xtc_threshold", 1.5)):
            refused = client.post(path, json={**body, name: bad})
            assert refused.status_code == 400 and refused.json()["error"]["param"] == name, refused.text


def test_fields_left_out_take_the_models_recommended_sampling(client: Any, fake_engine: FakeEngine) -> None:
    # generation_config.json's recommendation (Qwen3: temperature 0.6, top_p 0.95, top_k 20) fills what a request
    # leaves out, as vLLM does; a request's own value wins, and top_p 0 still means greedy.
    fake_engine.sampling_defaults = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    _post(client)
    s = fake_engine.requests[-1].sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p) == (0.6, 0.95, 20, 0.0)
    _post(client, temperature=1.0, top_k=0)
    s = fake_engine.requests[-1].sampling
    assert (s.temperature, s.top_p, s.top_k) == (1.0, 0.95, 0)
    _post(client, top_p=0)
    assert fake_engine.requests[-1].sampling.temperature == 0.0
    client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2})
    assert fake_engine.requests[-1].sampling.top_k == 20


def test_prompt_building(client: Any, fake_engine: FakeEngine) -> None:
    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "reasoning_content": "hmm",
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": False}}]
    before = len(fake_engine.tokenizer.template_calls)
    response = client.post("/v1/chat/completions", json={
        "model": "fake-model", "messages": messages, "tools": tools, "reasoning_effort": "none",
        "chat_template_kwargs": {"preserve_thinking": True}, "store": False, "prompt_cache_key": "k",
        "prompt_cache_retention": "24h", "parallel_tool_calls": False, "service_tier": "auto",
        "modalities": ["text"], "response_format": {"type": "text"}, "user": "u-1",
    })
    assert response.status_code == 200, response.text
    call = fake_engine.tokenizer.template_calls[before]  # the prompt itself (later calls may probe segments)
    rendered = call["messages"]
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "tool"]
    assert rendered[1]["content"] == "ab"
    assert rendered[2]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert rendered[2]["reasoning_content"] == "hmm"
    assert rendered[3]["tool_call_id"] == "call_1"
    assert call["tools"][0]["function"]["name"] == "f"
    assert call["enable_thinking"] is False and call["preserve_thinking"] is True
    assert call["add_generation_prompt"] is True
    assert fake_engine.requests[-1].session_id == "k"


def test_affinity_header_is_the_session_hint(client: Any, fake_engine: FakeEngine) -> None:
    client.post("/v1/chat/completions", json={"messages": USER}, headers={"x-session-affinity": "s-1"})
    assert fake_engine.requests[-1].session_id == "s-1"


def test_empty_tools_list_is_accepted(client: Any, fake_engine: FakeEngine) -> None:
    assert _post(client, tools=[]).status_code == 200
    assert fake_engine.tokenizer.template_calls[-1]["tools"] is None


# -------------------------------------------------------------- tool-call replies, streamed and not

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


class CallingTokenizer(FakeTokenizer):
    """The fake tokenizer with <tool_call> JSON markers and <think> markers, as a model family declares them."""

    def __init__(self) -> None:
        super().__init__()
        self.tool_call_start, self.tool_call_end = json_tools.tool_call_start, json_tools.tool_call_end
        self.tool_parser = json_tools.parse_tool_call
        self.think_start, self.think_end = "<think>", "</think>"


def _replies(pieces: list[str]) -> tuple[dict[str, Any], list[Any], Any, list[str]]:
    """The non-streamed message, the streamed events, and the message and event types the openai SDK's stream
    helper assembles from those events."""
    engine = FakeEngine(pieces)
    engine.tokenizer = CallingTokenizer()
    with TestClient(create_app(AppState(engine=engine))) as client:
        whole = _post(client, tools=TOOLS).json()["choices"][0]["message"]
        events = sse_events(_post(client, tools=TOOLS, stream=True).text)
    state = ChatCompletionStreamState()
    kinds = [event.type for chunk in events[:-1] for event in state.handle_chunk(SDKChunk.model_validate(chunk))]
    return whole, events, state.get_final_completion().choices[0].message, kinds


def test_a_non_streamed_tool_call_has_no_index(fake_engine: FakeEngine) -> None:
    # OpenAI's ChatCompletionMessageToolCall has none; only streamed deltas carry `index` (it was "index": null).
    whole, events, _, _ = _replies([CALL])
    (call,) = whole["tool_calls"]
    assert set(call) == {"id", "type", "function"} and set(call["function"]) == {"name", "arguments"}
    streamed = [d for e in events[:-1] for d in e["choices"][0]["delta"].get("tool_calls", [])]
    assert streamed and all(d["index"] == 0 for d in streamed)


@pytest.mark.parametrize("pieces, content", [
    ([CALL], None),  # a tool-only reply
    (["<think>", "hmm", "</think>", CALL], None),  # thinking, then a call
    (["<think>", "hmm", "</think>"], ""),  # thinking alone: the non-streamed content is ""
    (["<think>", "hmm", "</think>", "Sunny."], "Sunny."),
])
def test_a_streamed_reply_assembles_to_the_non_streamed_message(pieces: list[str], content: str | None) -> None:
    whole, events, assembled, kinds = _replies(pieces)
    assert whole["content"] == assembled.content == content
    assert [c.function.name for c in assembled.tool_calls or []] == [c["function"]["name"] for c in
                                                                      whole.get("tool_calls", [])]
    first = events[0]["choices"][0]["delta"]
    # As OpenAI opens a reply of calls: content null (after thinking too, not yet known to be text)
    assert first["role"] == "assistant" and first["content"] is None
    if content is None:  # no spurious empty text event beside the calls
        assert "content.delta" not in kinds


def test_a_streamed_text_reply_opens_with_empty_content_as_openai_does(client: Any) -> None:
    events = sse_events(_post(client, stream=True).text)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert set(events[1]["choices"][0]["delta"]) == {"content"}
    with TestClient(create_app(AppState(engine=FakeEngine([""])))) as silent:  # a reply that says nothing
        empty = sse_events(_post(silent, stream=True).text)
    assert [e["choices"][0]["delta"] for e in empty[:-1]] == [{"role": "assistant", "content": ""}, {}]


def test_error_after_headers_is_an_sse_error_then_done(client: Any, fake_engine: FakeEngine) -> None:
    fake_engine.fail_with = "the step failed"
    events = sse_events(_post(client, stream=True).text)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["message"] == "the step failed"
    assert set(events[-2]["error"]) == {"message", "type", "param", "code"}
    assert not any(e.get("choices") and e["choices"][0]["finish_reason"] for e in events[:-2])


def test_a_stream_that_fails_before_its_first_token_is_a_500_not_an_empty_200(client: Any,
                                                                            fake_engine: FakeEngine) -> None:
    fake_engine.fail_with, fake_engine.fail_at = "the step failed", 0
    response = _post(client, stream=True)
    assert response.status_code == 500
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["error"]["message"] == "the step failed"
    assert response.json()["error"]["type"] == "server_error"
    assert fake_engine.closed_streams >= 1


def test_health_reports_an_engine_that_cannot_run_rows(client: Any, fake_engine: FakeEngine) -> None:
    assert client.get("/health").json()["status"] == "ok"
    fake_engine.failing = "RuntimeError: device lost"
    response = client.get("/health")
    assert response.status_code == 503
    assert response.json() == {"status": "failing", "model": "fake-model", "error": "RuntimeError: device lost"}


def test_error_in_non_stream_is_a_500_in_openai_shape(client: Any, fake_engine: FakeEngine) -> None:
    fake_engine.fail_with = "the step failed"
    response = _post(client)
    assert response.status_code == 500
    assert response.json()["error"]["message"] == "the step failed"
    fake_engine.fail_with = None
    assert _post(client).status_code == 200


# -------------------------------------------------------------- cancellation at the ASGI level


@pytest.mark.anyio
async def test_disconnect_mid_stream_frees_the_row_and_spares_others() -> None:
    engine = FakeEngine(pieces=["a", "b", "c"])
    engine.gate = anyio.Event()  # the first stream stalls after its first piece
    app = create_app(AppState(engine=engine, ready=True))  # no lifespan here: ready by hand
    leaving = ASGIClient({"messages": USER, "stream": True, "max_tokens": 3}, marker=b'"content":"a"')
    staying = ASGIClient({"messages": USER, "stream": True, "max_tokens": 3}, marker=b'"content":"a"')
    async with anyio.create_task_group() as tg:
        tg.start_soon(app, asgi_scope("/v1/chat/completions"), leaving.receive, leaving.send)
        await leaving.first.wait()
        engine.gate = None
        tg.start_soon(app, asgi_scope("/v1/chat/completions"), staying.receive, staying.send)
        await staying.leave.wait()  # the second stream ran to its end
        leaving.leave.set()  # now the first client goes away
    assert engine.active == set()
    assert engine.closed_streams >= 1
    assert not any(b"[DONE]" in c for c in leaving.chunks)
    assert b"".join(staying.chunks).endswith(b"data: [DONE]\n\n")
    assert b'"finish_reason":"stop"' in b"".join(staying.chunks)


@pytest.mark.anyio
async def test_disconnect_during_non_stream_request_frees_the_row() -> None:
    engine = FakeEngine(pieces=["a", "b", "c"])
    engine.gate = anyio.Event()
    app = create_app(AppState(engine=engine, ready=True))  # no lifespan here: ready by hand
    client = ASGIClient({"messages": USER, "max_tokens": 3}, marker=b'"content":"a"')
    async with anyio.create_task_group() as tg:
        tg.start_soon(app, asgi_scope("/v1/chat/completions"), client.receive, client.send)
        while not engine.requests:  # wait until the row exists (each pass yields to the app task)
            await anyio.lowlevel.checkpoint()
        client.leave.set()
    assert engine.active == set()
    assert engine.closed_streams == 1


@pytest.mark.parametrize("seed,expected", [(-1, 2**64 - 1), (2**63 - 1, 2**63 - 1), (-(2**63), 2**63), (7, 7)])
def test_any_seed_in_openais_range_is_accepted(client: Any, fake_engine: FakeEngine, seed: int, expected: int) -> None:
    assert _post(client, seed=seed).status_code == 200
    assert fake_engine.requests[-1].sampling.seed == expected


# -------------------------------------------------------------- a slow first token

@pytest.mark.anyio
@pytest.mark.parametrize("path,body", [("/v1/chat/completions", {"messages": USER}), ("/v1/completions", {"prompt": "hi"})])
async def test_a_slow_first_token_gets_headers_and_keep_alives_meanwhile(monkeypatch, path: str, body: dict) -> None:
    # A queued or long prompt sent nothing, not even headers, until its first token (92 s on a busy CPU): clients
    # with a read timeout (httpx's default: 5 s) and proxies with an idle timeout cut the stream.
    from service.chat import respond

    monkeypatch.setattr(respond, "FIRST_BYTE_WAIT", 0.01)
    engine = FakeEngine(pieces=["a", "b"])
    engine.first_gate = anyio.Event()
    app = create_app(AppState(engine=engine, ready=True, config=ServiceConfig(sse_keepalive=0.01)))
    client = ASGIClient({**body, "stream": True, "max_tokens": 2}, marker=b": keep-alive\n\n")
    with anyio.fail_after(30):  # without keep-alives nothing is sent before the gate opens: fail, do not hang
        async with anyio.create_task_group() as tg:
            tg.start_soon(app, asgi_scope(path), client.receive, client.send)
            await client.first.wait()  # headers and a comment went out while the first token waited
            assert not any(b"data:" in chunk for chunk in client.chunks)
            engine.first_gate.set()
            await client.leave.wait()
    events = client.events()
    assert events[-1] == "[DONE]"
    text = "".join((c.get("delta", {}).get("content") or c.get("text") or "") for e in events[:-1] for c in e["choices"])
    assert text == "ab"


@pytest.mark.anyio
async def test_a_failure_after_keep_alives_is_an_error_event_then_done(monkeypatch) -> None:
    from service.chat import respond

    monkeypatch.setattr(respond, "FIRST_BYTE_WAIT", 0.01)
    engine = FakeEngine(pieces=["a", "b"])
    engine.first_gate, engine.fail_with, engine.fail_at = anyio.Event(), "the step failed", 0
    app = create_app(AppState(engine=engine, ready=True, config=ServiceConfig(sse_keepalive=0.01)))
    client = ASGIClient({"messages": USER, "stream": True}, marker=b": keep-alive\n\n")
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(app, asgi_scope("/v1/chat/completions"), client.receive, client.send)
            await client.first.wait()
            engine.first_gate.set()
            await client.leave.wait()
    events = client.events()
    assert events[-1] == "[DONE]" and events[-2]["error"]["message"] == "the step failed"
    assert engine.active == set()
