"""service/messages/schemas.py: values Anthropic refuses are refused by name (not taken silently), in Anthropic's
words where chat's differ; the ones it takes are taken (service_tier, whose one tier the reply's usage names)."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import TestClient

from tests.service.sse_events import named_events

USER = [{"role": "user", "content": "weather?"}]
TOOL = {"name": "get_weather", "input_schema": {"type": "object"}}


def _post(client: TestClient[Any], **fields: Any) -> Any:
    return client.post("/v1/messages", json={"model": "fake-model", "max_tokens": 8, "messages": USER, **fields})


def _text(**fields: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": "weather?", **fields}]}]


@pytest.mark.parametrize("fields, words", [
    ({"cache_control": {"type": "ephemeral", "ttl": "10m"}}, "cache_control.ttl: Input should be '5m' or '1h'"),
    ({"messages": _text(cache_control={"type": "ephemeral", "ttl": "2h"})}, "messages.0.content.0.cache_control.ttl"),
    ({"tools": [{**TOOL, "cache_control": {"type": "ephemeral", "ttl": "1d"}}]}, "tools.0.cache_control.ttl"),
    ({"tools": [TOOL, {**TOOL, "description": "again"}]}, "tools: Tool names must be unique"),
    ({"tools": [{"name": "f", "input_schema": {"type": "array"}}]}, "tools.0.input_schema: type"),
    ({"tools": [TOOL], "tool_choice": {"type": "none", "disable_parallel_tool_use": False}},
     "tool_choice: disable_parallel_tool_use"),
    ({"tool_choice": {"type": "auto"}}, "tool_choice: may only be specified while providing tools"),
    ({"tool_choice": {"type": "none"}}, "tool_choice: may only be specified while providing tools"),
    ({"messages": _text(citations=[{"type": "char_location", "cited_text": "x"}])},
     "messages.0.content.0.citations"),
    ({"service_tier": "priority"}, "service_tier"),
    # chat's words were "tool_choice \"required\"" and "names function": Anthropic's values are "any" and "tool"
    ({"tools": [], "tool_choice": {"type": "any"}}, "tool_choice: tool_choice \"any\" needs at least one tool"),
    ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "nope"}},
     "tool_choice: tool_choice names tool 'nope', which tools does not declare"),
])
def test_what_anthropic_refuses_is_a_400_naming_it(client: TestClient[Any], fields: dict[str, Any],
                                                   words: str) -> None:
    reply = _post(client, **fields)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith(words), error
    assert "required" not in error["message"] and "function" not in error["message"], error


@pytest.mark.parametrize("fields", [
    {"cache_control": {"type": "ephemeral", "ttl": "1h"}},
    {"messages": _text(cache_control={"type": "ephemeral", "ttl": "5m"}, citations=[])},
    {"messages": _text(citations=None)},
    {"tools": [{"name": "f", "input_schema": {"properties": {}}}]},  # no type: the SDK's Dict[str, object] branch
    {"tools": [], "tool_choice": {"type": "auto"}},
    {"tools": [TOOL], "tool_choice": {"type": "none"}},
    {"service_tier": "auto"},
    {"service_tier": "standard_only"},
])
def test_what_anthropic_takes_is_taken(client: TestClient[Any], fields: dict[str, Any]) -> None:
    reply = _post(client, **fields)
    assert reply.status_code == 200, reply.text


def test_the_reply_names_the_one_service_tier(client: TestClient[Any]) -> None:
    # Anthropic's Usage carries service_tier on the Message (message_start's too), not on message_delta's usage.
    assert _post(client, service_tier="auto").json()["usage"]["service_tier"] == "standard"
    events = {event["type"]: event for event in named_events(_post(client, stream=True).text)}
    assert events["message_start"]["message"]["usage"]["service_tier"] == "standard"
    assert "service_tier" not in events["message_delta"]["usage"]
