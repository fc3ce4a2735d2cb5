"""A tool call max_tokens cut, on /v1/chat/completions: a `tool_calls` entry with the arguments written so far and
finish_reason "length", streamed and not, as OpenAI returns one — never the model's call markup as content."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import TestClient
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk as SDKChunk

from service.app import create_app
from service.state import AppState
from tests.service.chat.test_routes import CallingTokenizer
from tests.service.conftest import sse_events
from tests.service.fake_engine import FakeEngine

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
# A call the engine writes in five pieces, one token each: max_tokens 3 ends it inside its arguments.
CALL_PIECES = ["<tool_call>", '\n{"name": "add", ', '"arguments": {"a": 1', ', "b": 2}}', "\n</tool_call>"]
WHOLE_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 0}}\n</tool_call>'


def post_whole_and_streamed(path: str, pieces: list[str], request: dict[str, Any]) -> tuple[Any, str]:
    """One scripted reply (a tool-calling template) on `path`, asked plain and streamed: the plain reply's JSON and
    the stream's text."""
    engine = FakeEngine(pieces)
    engine.tokenizer = CallingTokenizer()
    with TestClient(create_app(AppState(engine=engine))) as client:
        whole = client.post(path, json=request)
        streamed = client.post(path, json={**request, "stream": True})
    assert whole.status_code == streamed.status_code == 200, whole.text
    return whole.json(), streamed.text


def _replies(pieces: list[str], max_tokens: int, **body: Any) -> tuple[dict[str, Any], list[Any]]:
    """The non-streamed choice and the streamed chunks of one scripted reply."""
    request = {"model": "fake-model", "messages": [{"role": "user", "content": "add"}], "tools": TOOLS,
               "max_tokens": max_tokens, **body}
    whole, streamed = post_whole_and_streamed("/v1/chat/completions", pieces, request)
    return whole["choices"][0], sse_events(streamed)[:-1]


def _streamed_message(chunks: list[Any]) -> Any:
    """The choice the openai SDK's stream helper assembles (its snapshot: at finish_reason "length" the final
    completion raises LengthFinishReasonError)."""
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(SDKChunk.model_validate(chunk))
    return state.current_completion_snapshot.choices[0]


@pytest.mark.parametrize("pieces, max_tokens, content, calls", [
    (CALL_PIECES, 3, None, [("add", '{"a": 1')]),
    (CALL_PIECES, 2, None, [("add", "")]),  # cut before its arguments: the name alone
    # a complete first call, then a cut second: the first stays whole
    ([WHOLE_CALL, "\n", *CALL_PIECES], 5, None, [("add", '{"a": 0}'), ("add", '{"a": 1')]),
    # no name to read: the reply ends with what was said before the call
    (["Sure.", " ", "<tool_call>", '\n{"na', 'me": "add"}'], 4, "Sure. ", []),
])
def test_a_cut_call_is_a_call_with_its_arguments_so_far(pieces: list[str], max_tokens: int, content: str | None,
                                                        calls: list[tuple[str, str]]) -> None:
    choice, chunks = _replies(pieces, max_tokens)
    message = choice["message"]
    assert choice["finish_reason"] == "length"
    assert message["content"] == content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])] == calls
    said = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert "<tool_call>" not in said and said == (content or "")
    assembled = _streamed_message(chunks)
    assert assembled.finish_reason == "length"
    assert [(c.function.name, c.function.arguments) for c in assembled.message.tool_calls or []] == calls


def test_a_forced_call_cut_inside_its_name_has_the_forced_name() -> None:
    pieces = ["<tool_call>", '\n{"name": "ad', 'd", "arguments": {}}', "</tool_call>"]
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        whole, chunks = _replies(pieces, 2, tool_choice=choice)
        assert whole["finish_reason"] == "length" and whole["message"]["content"] is None
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in whole["message"]["tool_calls"]] == \
            [("add", "")]
        assert [(c.function.name, c.function.arguments) for c in _streamed_message(chunks).message.tool_calls or []] \
            == [("add", "")]
