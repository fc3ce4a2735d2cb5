"""A tool call max_tokens cut, on /v1/messages: a tool_use block with stop_reason "max_tokens", as Anthropic's
(its stream may end midway through a parameter): `input` is what the partial arguments say, the stream's
input_json_deltas their text — never the model's call markup as a text block."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.service.chat.test_cut_calls import CALL_PIECES, WHOLE_CALL, post_whole_and_streamed
from tests.service.sse_events import named_events

TOOLS = [{"name": "add", "input_schema": {"type": "object"}}]
ARGUMENTS_CUT = ["<tool_call>", '\n{"name": "add", ', '"arguments": {"a": 1, ', '"b": "tw', 'o"}}', "</tool_call>"]


def _replies(pieces: list[str], max_tokens: int, **body: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    request = {"model": "fake-model", "max_tokens": max_tokens, "tools": TOOLS,
               "messages": [{"role": "user", "content": "add"}], **body}
    whole, streamed = post_whole_and_streamed("/v1/messages", pieces, request)
    return whole, named_events(streamed)


@pytest.mark.parametrize("pieces, max_tokens, inputs, partial_json", [
    (ARGUMENTS_CUT, 4, [{"a": 1}], ['{"a": 1, "b": "tw']),  # a string value cut short is left out of `input`
    (CALL_PIECES, 2, [{}], [None]),  # cut before its arguments
    ([WHOLE_CALL, "\n", *CALL_PIECES], 5, [{"a": 0}, {"a": 1}], ['{"a": 0}', '{"a": 1']),
])
def test_a_cut_call_is_a_tool_use_block_and_max_tokens(pieces: list[str], max_tokens: int,
                                                        inputs: list[dict[str, Any]],
                                                        partial_json: list[str | None]) -> None:
    message, events = _replies(pieces, max_tokens, tool_choice={"type": "any"})
    assert message["stop_reason"] == "max_tokens"
    assert [(b["type"], b["name"], b["input"]) for b in message["content"]] == [("tool_use", "add", i) for i in inputs]
    assert events[-2]["delta"]["stop_reason"] == "max_tokens"
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert [(b["type"], b["name"]) for b in starts] == [("tool_use", "add")] * len(inputs)
    sent: dict[int, str] = {}
    for event in events:
        if event["type"] == "content_block_delta":
            assert event["delta"]["type"] == "input_json_delta"
            sent[event["index"]] = sent.get(event["index"], "") + event["delta"]["partial_json"]
    assert [sent.get(i) for i in range(len(inputs))] == partial_json
    assert "<tool_call>" not in json.dumps(message)


def test_a_call_cut_before_its_name_leaves_the_text_said_before_it() -> None:
    message, events = _replies(["Sure.", " ", "<tool_call>", '\n{"na', 'me": "add"}'], 4)
    assert message["stop_reason"] == "max_tokens" and message["content"] == [{"type": "text", "text": "Sure. "}]
    assert "<tool_call>" not in json.dumps(events)
