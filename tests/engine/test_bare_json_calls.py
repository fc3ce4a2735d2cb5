"""Llama 3.x's tool calls, written as bare JSON: calls to declared tools become tool calls whole, anything else is
content exactly as written, and a reply that does not open with `{` streams at once."""

from __future__ import annotations

import pytest

from engine.bare_json_calls import BareJsonCallSplitter, parse_bare_calls, writes_bare_json_calls

NAMES = {"get_weather", "read"}


def run(pieces: list[str], cut: bool = False) -> tuple[str, list[tuple[str, str]]]:
    splitter = BareJsonCallSplitter(NAMES, new_call_id=lambda: "call_1")
    events = [e for piece in pieces for e in splitter.feed(piece)]
    events += splitter.finish(cut=True) if cut else splitter.finish()
    content = "".join(e.text for e in events if e.kind == "content")
    calls: list[list[str]] = []
    for event in events:
        if event.kind == "tool_call_start":
            calls.append([event.name, ""])
        elif event.kind == "tool_call_arguments":
            calls[event.index][1] += event.arguments
    return content, [(name, args) for name, args in calls]


@pytest.mark.parametrize("text, calls", [
    ('{"name": "get_weather", "parameters": {"city": "Paris"}}', [("get_weather", '{"city": "Paris"}')]),
    ('<|python_tag|>{"name": "read", "arguments": {"path": "a.py"}}', [("read", '{"path": "a.py"}')]),
    ('{"type": "function", "name": "read", "parameters": "{\\"path\\": \\"b\\"}"}', [("read", '{"path": "b"}')]),
    ('{"name": "read", "parameters": {"path": "a"}}; {"name": "get_weather", "parameters": {}}',
     [("read", '{"path": "a"}'), ("get_weather", "{}")]),
    ('\n{"name": "read", "parameters": {"path": "a"}}\n{"name": "read", "parameters": {"path": "b"}}\n',
     [("read", '{"path": "a"}'), ("read", '{"path": "b"}')]),
])
def test_calls_to_declared_tools_parse_at_every_split(text: str, calls: list[tuple[str, str]]) -> None:
    assert parse_bare_calls(text, NAMES) == calls
    for i in range(len(text) + 1):
        assert run([text[:i], text[i:]]) == ("", calls), i


@pytest.mark.parametrize("text", [
    '{"name": "Alice", "age": 3}',  # a JSON answer whose "name" is no tool
    '{"name": "unknown_tool", "parameters": {}}',
    '{"name": "read", "parameters": {"path": "a"}} and then some words',
    '{"name": "read", "parameters": {"path": ',  # cut off by max_tokens
    '{"name": "read", "parameters": [1, 2]}',
])
def test_anything_else_is_content_as_written(text: str) -> None:
    assert parse_bare_calls(text, NAMES) is None
    assert run([text[:5], text[5:]]) == (text, [])


@pytest.mark.parametrize("text, expected", [
    ('{"name": "read", "parameters": {"path": ', ("", [("read", '{"path":')])),
    ('<|python_tag|>{"name": "read", "parameters": {"path": "a"}}; {"name": "get_weather", "parameters": {"ci',
     ("", [("read", '{"path": "a"}'), ("get_weather", '{"ci')])),
    # JSON that names no declared tool, or whose name was cut, may be an answer: content as written
    ('{"name": "Alice", "age": 3', ('{"name": "Alice", "age": 3', [])),
    ('{"name": "rea', ('{"name": "rea', [])),
])
def test_calls_the_token_limit_cut_are_calls(text: str, expected: tuple[str, list[tuple[str, str]]]) -> None:
    for i in range(len(text) + 1):
        assert run([text[:i], text[i:]], cut=True) == expected, i


def test_prose_streams_at_once() -> None:
    splitter = BareJsonCallSplitter(NAMES)
    assert splitter.feed("  ") == []
    events = splitter.feed("The weather")
    assert [e.text for e in events] == ["  The weather"]  # type: ignore[union-attr]
    assert [e.text for e in splitter.feed(" is fine.")] == [" is fine."]  # type: ignore[union-attr]


def test_only_llama3_style_templates_ask_for_bare_json() -> None:
    ask = ('Respond in the format {"name": function name, "parameters": dictionary of argument name and its '
           'value}.')
    assert writes_bare_json_calls(["{{ bos_token }}" + ask])
    assert not writes_bare_json_calls(["<tool_call>{{ tool_call.name }}</tool_call>"])
    assert not writes_bare_json_calls(None)
