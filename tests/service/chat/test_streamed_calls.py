"""A `<tool_call>` JSON call streams while it is written, on every chat route: its name first, then its arguments in
fragments that join to the whole — chat's tool_calls deltas, the Responses API's function_call_arguments.delta
events, Anthropic's input_json_delta — and the non-streamed reply is the same call."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk as SDKChunk

from tests.service.chat.test_cut_calls import post_whole_and_streamed
from tests.service.conftest import sse_events
from tests.service.sse_events import named_events

ARGUMENTS = '{"path": "a.txt", "content": "one\\ntwo}"}'
# One engine delta a piece: the name is read at the third, the arguments take three more.
PIECES = ["<tool_call>", '\n{"name": "write_to_file", ', '"arguments": ', '{"path": "a.txt", ', '"content": "one\\n',
          'two}"}', "}\n", "</tool_call>"]
FRAGMENTS = ['{"path": "a.txt", ', '"content": "one\\n', 'two}"}']
USER = [{"role": "user", "content": "write it"}]
FUNCTION = {"name": "write_to_file", "parameters": {"type": "object"}}


def _chat(pieces: list[str], **body: Any) -> tuple[dict[str, Any], list[Any]]:
    request = {"model": "fake-model", "messages": USER, "tools": [{"type": "function", "function": FUNCTION}], **body}
    whole, streamed = post_whole_and_streamed("/v1/chat/completions", pieces, request)
    return whole["choices"][0], sse_events(streamed)[:-1]


def _call_deltas(chunks: list[Any]) -> list[dict[str, Any]]:
    return [d for c in chunks if c["choices"] for d in c["choices"][0]["delta"].get("tool_calls") or []]


@pytest.mark.parametrize("body", [{}, {"tool_choice": "required"},  # a forced call (a grammar writes it) too
                                  {"tool_choice": {"type": "function", "function": {"name": "write_to_file"}}}])
def test_a_streamed_call_sends_its_name_first_then_its_arguments_as_written(body: dict[str, Any]) -> None:
    choice, chunks = _chat(PIECES, **body)
    deltas = _call_deltas(chunks)
    # One chunk per engine delta: the name at the third, before the arguments' last piece was written
    assert deltas[0]["function"] == {"name": "write_to_file", "arguments": ""} and deltas[0]["id"].startswith("call_")
    assert [d["function"]["arguments"] for d in deltas[1:]] == FRAGMENTS
    assert all(d["index"] == 0 and "id" not in d for d in deltas[1:])
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # the SDK's stream helper assembles the same call as the non-streamed reply
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(SDKChunk.model_validate(chunk))
    (assembled,) = state.get_final_completion().choices[0].message.tool_calls or []
    (call,) = choice["message"]["tool_calls"]
    assert assembled.function.arguments == call["function"]["arguments"] == ARGUMENTS
    assert assembled.id == deltas[0]["id"] and choice["message"]["content"] is None


def test_one_call_still_ends_the_reply_after_its_whole_call() -> None:
    # parallel_tool_calls false, or a named function: the first call's fragments did not end it, its close does
    second = ['<tool_call>{"name": "write_to_file", "arguments": {}}</tool_call>']
    forced = {"type": "function", "function": {"name": "write_to_file"}}
    for body in ({"parallel_tool_calls": False}, {"tool_choice": forced}):
        choice, chunks = _chat([*PIECES, "\n", *second], **body)
        assert [c["function"]["arguments"] for c in choice["message"]["tool_calls"]] == [ARGUMENTS], body
        assert "".join(d["function"]["arguments"] for d in _call_deltas(chunks)) == ARGUMENTS, body
        assert {d["index"] for d in _call_deltas(chunks)} == {0}


def test_responses_stream_function_call_arguments_deltas() -> None:
    request = {"model": "fake-model", "input": "write it", "tools": [{"type": "function", **FUNCTION}]}
    response, streamed = post_whole_and_streamed("/v1/responses", PIECES, request)
    events = named_events(streamed)
    kinds = [e["type"] for e in events]
    added = kinds.index("response.output_item.added")
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert deltas == FRAGMENTS and added < kinds.index("response.function_call_arguments.delta")
    (done,) = [e["arguments"] for e in events if e["type"] == "response.function_call_arguments.done"]
    assert done == ARGUMENTS
    assert [(i["type"], i["name"], i["arguments"]) for i in response["output"]] == \
        [("function_call", "write_to_file", ARGUMENTS)]


def test_messages_stream_input_json_deltas() -> None:
    request = {"model": "fake-model", "max_tokens": 100, "messages": USER,
               "tools": [{"name": "write_to_file", "input_schema": {"type": "object"}}]}
    message, streamed = post_whole_and_streamed("/v1/messages", PIECES, request)
    events = named_events(streamed)
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert [(b["type"], b["name"]) for b in starts] == [("tool_use", "write_to_file")]
    partial = [e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"]
    assert partial == FRAGMENTS
    assert [(b["type"], b["input"]) for b in message["content"]] == [("tool_use", json.loads(ARGUMENTS))]
    assert message["stop_reason"] == "tool_use"
