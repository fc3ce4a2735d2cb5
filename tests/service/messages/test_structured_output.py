"""Anthropic's structured outputs on /v1/messages: `output_config.format` (and the deprecated beta `output_format`)
as chat's strict json_schema response_format, enforced token by token; a tool's `strict` as its function's; their
refusals named by the Anthropic field."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.messages.schemas import MessagesRequest
from service.messages.translate import chat_request
from service.state import AppState
from tests.service.chat.test_routes import CallingTokenizer
from tests.service.fake_engine import FakeEngine

USER = [{"role": "user", "content": "Is it sunny?"}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
FORMAT = {"type": "json_schema", "schema": SCHEMA}
TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                                "required": ["city"], "additionalProperties": False}}


def _body(**fields: Any) -> dict[str, Any]:
    return {"model": "fake-model", "max_tokens": 64, "messages": USER, **fields}


def test_output_config_format_is_a_strict_json_schema_beside_the_effort() -> None:
    # It was a 400: "output_config: 'format' is not supported" (the SDK's messages.parse, LangChain's json_schema).
    chat = chat_request(MessagesRequest.model_validate(_body(output_config={"format": FORMAT, "effort": "low"})))
    assert chat.response_format == {"type": "json_schema",
                                    "json_schema": {"name": "output", "schema": SCHEMA, "strict": True}}
    assert chat.reasoning_effort == "low"
    # the deprecated beta name (older SDKs' output_format=) asks the same
    old = chat_request(MessagesRequest.model_validate(_body(output_format=FORMAT)))
    assert old.response_format == chat.response_format


def test_the_reply_follows_the_schema_as_chats_response_format_does(fake_engine: FakeEngine,
                                                                      client: TestClient[Any]) -> None:
    chat = client.post("/v1/chat/completions", json={"messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"name": "output", "schema": SCHEMA, "strict": True}}})
    assert chat.status_code == 200, chat.text
    expected = fake_engine.requests[-1].sampling.grammar
    reply = client.post("/v1/messages", json=_body(output_config={"format": FORMAT}))
    assert reply.status_code == 200, reply.text
    grammar = fake_engine.requests[-1].sampling.grammar
    assert grammar is not None and grammar.text == expected.text and '"ok"' in grammar.text


def test_a_strict_tool_constrains_its_calls() -> None:
    # It was a 400: "tools.0: 'strict' is not supported" (LangChain's bind_tools(strict=True)).
    engine = FakeEngine(["Sunny."])
    engine.tokenizer = CallingTokenizer()
    with TestClient(create_app(AppState(engine=engine))) as client:
        loose = client.post("/v1/messages", json=_body(tools=[TOOL]))
        assert loose.status_code == 200, loose.text
        assert engine.requests[-1].sampling.grammar is None
        strict = client.post("/v1/messages", json=_body(tools=[{**TOOL, "strict": True}]))
        assert strict.status_code == 200, strict.text
    grammar = engine.requests[-1].sampling.grammar
    assert grammar is not None and grammar.calls is not None and "city" in grammar.calls


@pytest.mark.parametrize("fields, words", [
    # a model whose calls are not <tool_call> JSON: chat's refusal, named by the Anthropic field
    ({"tools": [{**TOOL, "strict": True}]}, "tools.0.strict: strict function calling is offered for models"),
    # a prefill the reply continues cannot also be JSON from its first token
    ({"output_config": {"format": FORMAT}, "messages": [*USER, {"role": "assistant", "content": "{"}]},
     "output_config.format: JSON output is enforced"),
    ({"output_format": FORMAT, "messages": [*USER, {"role": "assistant", "content": "{"}]},
     "output_format: JSON output is enforced"),
    ({"output_config": {"format": FORMAT}, "output_format": FORMAT}, "output_format: deprecated"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": 5}}}}, "output_config.format"),
    ({"output_config": {"format": {"type": "json_object"}}}, "output_config.format"),
])
def test_what_cannot_be_enforced_is_a_400_naming_the_anthropic_field(client: TestClient[Any], fields: dict[str, Any],
                                                                     words: str) -> None:
    reply = client.post("/v1/messages", json=_body(**fields))
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith(words), error
    assert "response_format" not in error["message"] and "function.strict" not in error["message"], error
