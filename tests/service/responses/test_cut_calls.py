"""A tool call max_output_tokens cut, on /v1/responses: a `function_call` item with the arguments written so far and
status "incomplete", the response incomplete (max_output_tokens) — never a message item of the model's call
markup."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.service.chat.test_cut_calls import CALL_PIECES, WHOLE_CALL, post_whole_and_streamed
from tests.service.sse_events import named_events

TOOLS = [{"type": "function", "name": "add", "parameters": {"type": "object"}}]


def _replies(pieces: list[str], max_output_tokens: int,
             tools: list[Any] = TOOLS) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    request = {"model": "fake-model", "input": "add", "tools": tools, "max_output_tokens": max_output_tokens}
    whole, streamed = post_whole_and_streamed("/v1/responses", pieces, request)
    return whole, named_events(streamed)


@pytest.mark.parametrize("pieces, limit, calls", [
    (CALL_PIECES, 3, [("add", '{"a": 1', "incomplete")]),
    # a complete first call, then a cut second (the `llm` probe's reply): the first stays complete
    ([WHOLE_CALL, "\n", *CALL_PIECES], 5, [("add", '{"a": 0}', "completed"), ("add", '{"a": 1', "incomplete")]),
])
def test_a_cut_call_is_an_incomplete_function_call(pieces: list[str], limit: int,
                                                   calls: list[tuple[str, str, str]]) -> None:
    response, events = _replies(pieces, limit)
    final = events[-1]
    assert final["type"] == "response.incomplete"
    for body in (response, final["response"]):
        assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
        assert [(i["type"], i["name"], i["arguments"], i["status"]) for i in body["output"]] == \
            [("function_call", *call) for call in calls]
    done = [e["arguments"] for e in events if e["type"] == "response.function_call_arguments.done"]
    assert done == [arguments for _, arguments, _ in calls]
    assert "<tool_call>" not in json.dumps(events)


def test_a_cut_custom_tool_call_has_its_input_as_far_as_it_was_written() -> None:
    # Codex's apply_patch: the patch so far, not the JSON text of the function it was offered as
    pieces = ["<tool_call>", '\n{"name": "apply_patch", "arguments": {"input": "*** Begin', ' Patch\\n', '"}}']
    response, events = _replies(pieces, 2, tools=[{"type": "custom", "name": "apply_patch"}])
    for body in (response, events[-1]["response"]):
        assert [(i["type"], i["input"], i["status"]) for i in body["output"]] == \
            [("custom_tool_call", "*** Begin", "incomplete")]
