"""A gpt-oss (harmony) model's replies as OpenAI clients read them: the analysis channel in `reasoning_content`,
the final channel in `content`, a message to `functions.NAME` as a tool call with finish_reason "tool_calls" —
streamed and not — and its earlier thinking handed back to the template as `thinking`."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.chat.prompt import PROBE_TEXT
from service.state import AppState
from tests.service.conftest import sse_events
from tests.service.fake_engine import FakeEngine, FakeTokenizer

MARKERS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")
ANSWER = ["<|channel|>", "analysis", "<|message|>", "Greeting; ", "answer briefly.", "<|end|>", "<|start|>",
          "assistant", "<|channel|>", "final", "<|message|>", "Hello", " there!"]
CALL = ["<|channel|>", "analysis", "<|message|>", "Need weather.", "<|end|>", "<|start|>", "assistant",
        "<|channel|>", "commentary to=", "functions.get_weather ", "<|constrain|>", "json", "<|message|>",
        '{"city"', ': "Paris"}']
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


class HarmonyTokenizer(FakeTokenizer):
    """The fake tokenizer with harmony's markers in its vocabulary and gpt-oss's generation prompt."""

    def get_vocab(self) -> dict[str, int]:
        vocab = super().get_vocab()
        return {**vocab, **{marker: self.vocab + i for i, marker in enumerate(MARKERS)}}

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: Any = None, *, tokenize: bool = True,
                            **kwargs: Any) -> list[int] | str:
        if not any(m.get("content") == PROBE_TEXT for m in messages):  # the server's probe is no request's prompt
            self.template_calls.append({"messages": messages, "tools": tools, **kwargs})
        text = "".join(f"<|start|>{m['role']}<|message|>{m['content']}<|end|>" for m in messages)
        if kwargs.get("add_generation_prompt"):
            text += "<|start|>assistant"
        return self.encode(text) if tokenize else text


@pytest.fixture
def engine() -> FakeEngine:
    engine = FakeEngine(context_length=4096)
    engine.tokenizer = HarmonyTokenizer()
    return engine


def _client(engine: FakeEngine) -> Iterator[TestClient[Any]]:
    with TestClient(create_app(AppState(engine=engine))) as client:
        yield client


def _streamed(client: TestClient[Any], body: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    response = client.post("/v1/chat/completions", json={**body, "stream": True})
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    message: dict[str, Any] = {"content": "", "reasoning_content": "", "tool_calls": {}}
    finish = None
    for event in events[:-1]:
        assert "error" not in event, event
        for choice in event["choices"]:
            delta = choice["delta"]
            message["content"] += delta.get("content") or ""
            message["reasoning_content"] += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or []:
                entry = message["tool_calls"].setdefault(call["index"], {"name": "", "arguments": ""})
                entry["name"] += (call.get("function") or {}).get("name") or ""
                entry["arguments"] += (call.get("function") or {}).get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return message, finish


def test_an_answer_splits_into_reasoning_and_content(engine: FakeEngine) -> None:
    engine.pieces = ANSWER
    for client in _client(engine):
        body = {"messages": [{"role": "user", "content": "hi"}]}
        choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
        assert choice["message"]["content"] == "Hello there!"
        assert choice["message"]["reasoning_content"] == "Greeting; answer briefly."
        assert choice["finish_reason"] == "stop"
        message, finish = _streamed(client, body)
        assert (message["content"], message["reasoning_content"], finish) == \
            ("Hello there!", "Greeting; answer briefly.", "stop")


def test_a_message_to_a_function_is_a_tool_call(engine: FakeEngine) -> None:
    engine.pieces = CALL
    for client in _client(engine):
        body = {"messages": [{"role": "user", "content": "weather in Paris?"}], "tools": TOOLS}
        choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
        assert not choice["message"]["content"] and choice["message"]["reasoning_content"] == "Need weather."
        message, finish = _streamed(client, body)
        assert finish == "tool_calls" and message["content"] == ""
        assert message["tool_calls"] == {0: {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


@pytest.mark.parametrize("tools", [None, []])
def test_without_declared_tools_a_call_is_content(engine: FakeEngine, tools: list[Any] | None) -> None:
    # OpenAI returns calls only to functions the request declared: this reply was finish_reason "tool_calls".
    engine.pieces = CALL
    for client in _client(engine):
        body: dict[str, Any] = {"messages": [{"role": "user", "content": "weather in Paris?"}]}
        if tools is not None:
            body["tools"] = tools
        choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
        assert choice["finish_reason"] == "stop" and not choice["message"].get("tool_calls")
        assert choice["message"]["content"] == '{"city": "Paris"}'
        message, finish = _streamed(client, body)
        assert finish == "stop" and message["tool_calls"] == {} and message["content"] == '{"city": "Paris"}'


def test_earlier_thinking_reaches_the_template_as_thinking(engine: FakeEngine) -> None:
    engine.pieces = ANSWER
    for client in _client(engine):
        messages = [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "reasoning_content": "Need weather.",
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ]
        response = client.post("/v1/chat/completions", json={"messages": messages, "tools": TOOLS})
        assert response.status_code == 200, response.text
    rendered = engine.tokenizer.template_calls[-1]["messages"]
    assert rendered[1]["thinking"] == "Need weather." == rendered[1]["reasoning_content"]


@pytest.fixture(scope="module")
def harmony_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient[Any], dict[str, int]]]:
    """The real engine on a tiny harmony checkpoint (tests/engine/test_harmony.py), in process."""
    from service.config import ServiceConfig
    from service.engines import open_engine
    from tests.engine.test_harmony import build_harmony_llm

    path = build_harmony_llm(tmp_path_factory.mktemp("harmony"))
    vocab = json.loads((path / "tokenizer.json").read_text())["model"]["vocab"]
    state = AppState(config=ServiceConfig(model=str(path)), load_engine=open_engine)
    with TestClient(create_app(state)) as client:
        yield client, vocab


def test_a_call_token_ends_the_reply(harmony_server: tuple[TestClient[Any], dict[str, int]]) -> None:
    # The checkpoint's config names only <|return|>: without harmony's own stops the reply ran on past <|call|>.
    client, vocab = harmony_server
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0,
            "logit_bias": {str(vocab["<|call|>"]): 100}, "reasoning_effort": "high"}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    reply = response.json()
    assert reply["choices"][0]["finish_reason"] == "stop" and reply["usage"]["completion_tokens"] == 1


def test_markers_the_model_writes_never_reach_content(harmony_server: tuple[TestClient[Any], dict[str, int]]) -> None:
    client, vocab = harmony_server
    bias = {str(vocab[m]): 2 for m in ("<|channel|>", "<|message|>", "<|end|>", "<|start|>")}
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "temperature": 0, "logit_bias": bias,
            "logprobs": True}
    choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    written = "".join(t["token"] for t in choice["logprobs"]["content"])
    assert "<|message|>" in written and "<|channel|>" in written  # the random model did write harmony's markers
    message = choice["message"]
    for text in (message.get("content") or "", message.get("reasoning_content") or ""):
        assert not any(m in text for m in MARKERS), text


def test_a_tool_without_a_description_renders(harmony_server: tuple[TestClient[Any], dict[str, int]]) -> None:
    # The gpt-oss-shaped template writes each tool's description, which OpenAI's tools may leave out (it was a 400).
    client, _ = harmony_server
    tools = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": tools, "max_tokens": 2}
    assert client.post("/v1/chat/completions", json=body).status_code == 200


@pytest.mark.parametrize("effort, status", [("high", 200), ("low", 200), ("none", 400), ("xhigh", 400),
                                            ("bogus", 400)])
def test_only_the_efforts_gpt_oss_knows_are_taken(engine: FakeEngine, effort: str, status: int) -> None:
    # "Reasoning: bogus" (or "none", which does not switch gpt-oss's thinking off) went into its prompt as is.
    for client in _client(engine):
        response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                             "reasoning_effort": effort})
        assert response.status_code == status, response.text
        if status == 400:
            assert response.json()["error"]["param"] == "reasoning_effort" and "low, medium or high" in \
                response.json()["error"]["message"]
