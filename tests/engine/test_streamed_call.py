"""A `<tool_call>` JSON call to a declared function streams while it is written: its name once the block reads
`{"name": ..., "arguments":`, then its arguments' text, never the outer brace or the closing marker."""

from __future__ import annotations

import json

import pytest

from engine.chat_output import (  # first: engine picks the BLAS before mlx loads
    ChatOutputSplitter,
    ContentText,
    OutputEvent,
    ToolCallArguments,
    ToolCallStart,
)
from engine.cut_calls import read_cut_block
from tests.engine.test_chat_output import QWEN, CODER, splits
from tests.fixtures.output_events import joined_calls

TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
         for name in ("write_to_file", "read")]
# Arguments whose strings hold what the scanner must not take for their end: braces, an escaped quote, markup.
ARGUMENTS = '{"path": "a.txt", "content": "x = {1: \\"}\\"}\\n</tool", "n": [1, {"b": null}]}'
BLOCK = '<tool_call>\n{"name": "write_to_file", "arguments": ' + ARGUMENTS + '}\n</tool_call>'


def feed(pieces: list[str], *, cut: bool | None = False, tools=TOOLS, markers=QWEN) -> list[OutputEvent]:
    """The events of a reply fed in `pieces`, then finished (`cut`: by the token limit; None: not finished)."""
    ids = iter(f"call_{i}" for i in range(100))
    splitter = ChatOutputSplitter(markers, tools=tools, new_call_id=lambda: next(ids))
    events = [e for piece in pieces for e in splitter.feed(piece)]
    return events + (splitter.finish(cut=cut) if cut is not None else [])


def test_the_name_goes_out_before_the_arguments_are_written_and_the_fragments_join_to_them() -> None:
    events: list[tuple[int, OutputEvent]] = []
    splitter = ChatOutputSplitter(QWEN, tools=TOOLS)
    for i, ch in enumerate(BLOCK):
        events += [(i, e) for e in splitter.feed(ch)]
    events += [(len(BLOCK), e) for e in splitter.finish()]
    (at, start), *fragments = events
    assert isinstance(start, ToolCallStart) and start.name == "write_to_file"
    assert BLOCK[:at + 1].endswith('"arguments":')  # announced as soon as the block reads it
    assert all(isinstance(e, ToolCallArguments) and e.index == 0 for _, e in fragments)
    assert len(fragments) > 20 and fragments[0][0] < BLOCK.index("n\": [1")  # streamed as written, not at the end
    assert [e.last for _, e in fragments] == [False] * (len(fragments) - 1) + [True]
    assert "".join(e.arguments for _, e in fragments) == ARGUMENTS  # as written, valid JSON
    json.loads(ARGUMENTS)


def test_nothing_past_the_arguments_value_is_sent_at_any_split() -> None:
    # The outer brace, the whitespace after it and the marker never go out, however the text is split.
    text = "Sure.\n" + BLOCK.replace(' "arguments": ', '\n  "arguments" :\t') + "\n<tool_call>" \
        '{"name": "read", "arguments": {}}</tool_call> done'
    for pieces in splits(text):
        events = feed(pieces)
        assert joined_calls(events) == [("write_to_file", ARGUMENTS), ("read", "{}")], pieces
        if len(pieces) == len(text):  # one character at a time: the arguments went out as they came
            assert sum(isinstance(e, ToolCallArguments) for e in events) > len(ARGUMENTS) // 2
        assert "".join(e.text for e in events if isinstance(e, ContentText)) == "Sure.\ndone"


@pytest.mark.parametrize("block, arguments", [
    # the outer object's brace left out: the value is whole all the same
    ('{"name": "read", "arguments": {"path": "a"}\n', '{"path": "a"}'),
    # a value cut short by the closing marker: the call stays a call, its arguments as written (not JSON)
    ('{"name": "read", "arguments": {"path": "a", \n', '{"path": "a", '),
    ('{"name": "read", "arguments": {"path": "a"}} trailing words', '{"path": "a"}'),
])
def test_an_announced_block_that_does_not_parse_stays_a_call(block: str, arguments: str) -> None:
    for ending in ("</tool_call>", ""):  # closed, or the reply's end
        for pieces in splits("<tool_call>" + block + ending):
            events = feed(pieces)
            # (trailing whitespace of a value left open goes as it was sent, or not)
            assert [(n, a.rstrip()) for n, a in joined_calls(events)] == [("read", arguments.rstrip())], pieces
            assert not [e for e in events if isinstance(e, ContentText)]


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "write_to_file", "arguments": {"path": "a.txt", "content": "line\\n',
    '<tool_call>\n{"name": "write_to_file", "arguments": {"path": "a.txt", ',
    '<tool_call>\n{"name": "write_to_file", "arguments": ',
    '<tool_call>\n{"name": "write_to_file", "arguments": {"path": "a.txt"}\n</tool_',
])
def test_a_cut_call_ends_as_cut_calls_reads_it_and_begins_with_what_was_streamed(text: str) -> None:
    block = text.removeprefix("<tool_call>").removesuffix("\n</tool_")
    name, expected = read_cut_block(block, QWEN.tool_parser, TOOLS).cut or ("", "")
    for pieces in splits(text):
        streamed = joined_calls(feed(pieces, cut=None))
        (final,) = joined_calls(feed(pieces, cut=True))
        if len(pieces) == len(text):  # one character at a time: announced before the cut
            assert streamed and streamed[0][0] == name
        assert (final[0], final[1].rstrip()) == (name, expected), pieces  # but for whitespace already sent
        assert all(final[1].startswith(sent) for _, sent in streamed)


def test_two_objects_in_one_block_are_two_calls() -> None:
    text = '<tool_call>{"name": "read", "arguments": {"a": 1}}\n{"name": "write_to_file", "arguments": {}}</tool_call>'
    for pieces in splits(text):
        assert joined_calls(feed(pieces)) == [("read", '{"a": 1}'), ("write_to_file", "{}")], pieces


@pytest.mark.parametrize("block", [
    '{"name": "delete_all", "arguments": {"x": 1}}',  # a name the request did not declare
    '{"arguments": {"x": 1}, "name": "read"}',  # arguments before the name
    '[{"name": "read", "arguments": {"x": 1}}]',
])
def test_other_blocks_come_whole_at_their_end(block: str) -> None:
    for pieces in splits("<tool_call>" + block):
        assert feed(pieces, cut=None) == [], pieces  # nothing until the block closes
    events = feed(["<tool_call>" + block + "</tool_call>"])
    assert [type(e) for e in events] in ([ToolCallStart, ToolCallArguments], [ContentText])


def test_arguments_written_as_a_json_string_are_announced_then_sent_decoded() -> None:
    text = '<tool_call>{"name": "read", "arguments": "{\\"path\\": \\"a\\"}"}</tool_call>'
    for pieces in splits(text):
        assert joined_calls(feed(pieces)) == [("read", '{"path": "a"}')], pieces


def test_without_declared_tools_or_for_other_families_calls_come_whole() -> None:
    assert feed([BLOCK[:60]], cut=None, tools=None) == []
    coder = "<tool_call>\n<function=read>\n<parameter=path>\nx.py\n</parameter>\n</function>\n"
    assert feed([coder], cut=None, markers=CODER) == []


# The calls' grammar lets a string hold the end marker's text (a forced SmolLM2 call wrote `"100}}</tool_call>`):
# only a marker where the call's JSON is complete ends the call.
INSIDE = '{"a": "x</tool_call>y", "b": ["</tool_call>", "q\\"</tool_call>"]}'


@pytest.mark.parametrize("name", ["read", "undeclared"])  # streamed, and read whole by the parser at the block's end
def test_the_end_marker_inside_a_string_is_argument_text_at_any_split(name: str) -> None:
    text = f'<tool_call>\n{{"name": "{name}", "arguments": {INSIDE}}}\n</tool_call> done'
    for pieces in splits(text):
        events = feed(pieces)
        assert [(n, json.loads(a)) for n, a in joined_calls(events)] == [(name, json.loads(INSIDE))], pieces
        assert "".join(e.text for e in events if isinstance(e, ContentText)) == "done", pieces


def test_a_call_cut_inside_a_string_ending_like_the_marker_keeps_that_text() -> None:
    text = '<tool_call>{"name": "read", "arguments": {"a": "x</tool'
    events = feed(list(text), cut=True)
    assert joined_calls(events) == [("read", '{"a": "x</tool')]
