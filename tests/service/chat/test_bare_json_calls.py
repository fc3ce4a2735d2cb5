"""A Llama 3.x model's bare JSON call reaches OpenAI clients as `tool_calls` with finish_reason "tool_calls" (it
came back as content before), streamed and not; without tools, or with tool_choice "none", the same text is
content."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.state import AppState
from tests.service.chat.test_harmony_replies import _streamed
from tests.service.fake_engine import FakeEngine, FakeTokenizer

ASK = 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
CALL = ['{"name": ', '"get_weather", "param', 'eters": {"city": "Paris"}}']
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


class Llama3Tokenizer(FakeTokenizer):
    """The fake tokenizer with a chat template that asks for Llama 3's bare JSON calls, as 3.1–3.3's do."""

    chat_template = "{{ bos_token }}{% if tools %}" + ASK + "{% endif %}{{ tool_calls }}"


@pytest.fixture
def client() -> Iterator[TestClient[Any]]:
    engine = FakeEngine(CALL, context_length=4096)
    engine.tokenizer = Llama3Tokenizer()
    with TestClient(create_app(AppState(engine=engine))) as client:
        yield client


def test_a_bare_json_call_is_a_tool_call(client: TestClient[Any]) -> None:
    body = {"messages": [{"role": "user", "content": "weather in Paris?"}], "tools": TOOLS}
    choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    message, finish = _streamed(client, body)
    assert finish == "tool_calls" and message["content"] == ""
    assert message["tool_calls"] == {0: {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


@pytest.mark.parametrize("extra", [{}, {"tool_choice": "none"}])
def test_without_tools_the_json_is_content(client: TestClient[Any], extra: dict[str, Any]) -> None:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "weather in Paris?"}], **extra}
    if extra:
        body["tools"] = TOOLS
    choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == "".join(CALL)
