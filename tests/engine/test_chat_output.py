"""ChatOutputSplitter: reasoning, content and tool calls reassemble the same however the text is split."""

from __future__ import annotations

import json
import random

import pytest

from engine.chat_output import (  # first: engine picks the BLAS before mlx loads
    ChatOutputSplitter,
    ContentText,
    OutputMarkers,
    ReasoningText,
    ToolCallArguments,
    ToolCallStart,
    starts_in_reasoning,
)
from mlx_lm.tool_parsers import json_tools, qwen3_coder  # noqa: E402
from tests.fixtures.output_events import joined_calls

QWEN = OutputMarkers("<think>", "</think>", json_tools.tool_call_start, json_tools.tool_call_end, json_tools.parse_tool_call)
CODER = OutputMarkers(
    "<think>", "</think>", qwen3_coder.tool_call_start, qwen3_coder.tool_call_end, qwen3_coder.parse_tool_call
)
PLAIN = OutputMarkers()


def run(markers: OutputMarkers, pieces: list[str], *, in_reasoning: bool = False):
    ids = iter(f"call_{i}" for i in range(100))
    splitter = ChatOutputSplitter(markers, in_reasoning=in_reasoning, new_call_id=lambda: next(ids))
    events = []
    for piece in pieces:
        events += splitter.feed(piece)
    events += splitter.finish()
    return events


def reassemble(events) -> dict:
    content = "".join(e.text for e in events if isinstance(e, ContentText))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningText))
    calls: dict[int, dict] = {}
    for e in events:
        if isinstance(e, ToolCallStart):
            assert e.index not in calls, "a call starts once"
            calls[e.index] = {"id": e.id, "name": e.name, "arguments": ""}
        elif isinstance(e, ToolCallArguments):
            calls[e.index]["arguments"] += e.arguments
    tool_calls = [
        {"id": c["id"], "name": c["name"], "arguments": json.loads(c["arguments"])} for _, c in sorted(calls.items())
    ]
    return {"content": content, "reasoning": reasoning, "tool_calls": tool_calls}


def splits(text: str):
    """Every two-piece split, one-character pieces, and a few seeded random multi-piece splits."""
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]
    yield list(text)
    rng = random.Random(7)
    for _ in range(30):
        cuts = sorted(rng.sample(range(1, len(text)), k=min(5, len(text) - 1)))
        yield [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


CASES = [
    (
        "reasoning then answer",
        QWEN,
        False,
        "<think>Let me add.\n2+2=4</think>\n\nThe answer is 4.",
        {"content": "The answer is 4.", "reasoning": "Let me add.\n2+2=4", "tool_calls": []},
    ),
    (
        "template opened the think block",
        QWEN,
        True,
        "Thinking <b>bold</b>.</think>Done <thin",
        {"content": "Done <thin", "reasoning": "Thinking <b>bold</b>.", "tool_calls": []},
    ),
    (
        "layout newlines around thinking are dropped, inner ones kept",
        QWEN,
        True,
        "\nFirst.\n\nSecond.\n\n</think>\n\nAnswer.\n",
        {"content": "Answer.\n", "reasoning": "First.\n\nSecond.", "tool_calls": []},
    ),
    (
        "unterminated thinking keeps its trailing newline",
        QWEN,
        False,
        "<think>\nHmm\n",
        {"content": "", "reasoning": "Hmm\n", "tool_calls": []},
    ),
    (
        "content then two tool calls",
        QWEN,
        False,
        'I will look.\n<tool_call>\n{"name": "read", "arguments": {"path": "a.py", "n": 2}}\n</tool_call>\n'
        '<tool_call>{"name": "bash", "arguments": {"command": "ls <dir> | wc"}}</tool_call>',
        {
            "content": "I will look.\n",
            "reasoning": "",
            "tool_calls": [
                {"id": "call_0", "name": "read", "arguments": {"path": "a.py", "n": 2}},
                {"id": "call_1", "name": "bash", "arguments": {"command": "ls <dir> | wc"}},
            ],
        },
    ),
    (
        "reasoning, then a tool call with unicode",
        QWEN,
        True,
        'Need file.</think>\n<tool_call>{"name": "write", "arguments": {"text": "Café 🙂"}}</tool_call>',
        {
            "content": "",
            "reasoning": "Need file.",
            "tool_calls": [{"id": "call_0", "name": "write", "arguments": {"text": "Café 🙂"}}],
        },
    ),
    (
        "qwen3 coder xml call",
        CODER,
        False,
        "<tool_call>\n<function=read>\n<parameter=path>\nx.py\n</parameter>\n</function>\n</tool_call>",
        {"content": "", "reasoning": "", "tool_calls": [{"id": "call_0", "name": "read", "arguments": {"path": "x.py"}}]},
    ),
    (
        "marker look-alikes stay content",
        QWEN,
        False,
        "a <tool b <think> c </think> d <tool_cal",
        {"content": "a <tool b d <tool_cal", "reasoning": " c ", "tool_calls": []},
    ),
    (
        "no markers: everything is content",
        PLAIN,
        True,
        "<think>x</think><tool_call>{}</tool_call>",
        {"content": "<think>x</think><tool_call>{}</tool_call>", "reasoning": "", "tool_calls": []},
    ),
]


@pytest.mark.parametrize("name,markers,in_reasoning,text,expected", CASES, ids=[c[0] for c in CASES])
def test_reassembles_identically_at_every_split(name, markers, in_reasoning, text, expected):
    for pieces in splits(text):
        assert reassemble(run(markers, pieces, in_reasoning=in_reasoning)) == expected, pieces


def test_partial_marker_is_held_back_until_resolved():
    splitter = ChatOutputSplitter(QWEN)
    assert splitter.feed("Hi <tool") == [ContentText("Hi ")]
    assert splitter.feed("box>") == [ContentText("<toolbox>")]
    assert splitter.feed("<tool_") == []
    assert splitter.feed("call>") == []
    assert splitter.finish() == [ContentText("<tool_call>")]  # unterminated and unparsable: content as written
    assert splitter.unparsed_tool_text == [""]


@pytest.mark.parametrize("pieces, content", [
    (['Sure. <tool_call>{"name": "f", "argu', "ments: {bad}</tool_call>"],
     'Sure. <tool_call>{"name": "f", "arguments: {bad}</tool_call>'),
    (['<tool_call>{"name": "f", "arguments": {"x": 1'], '<tool_call>{"name": "f", "arguments": {"x": 1'),
])
def test_a_tool_call_that_does_not_parse_is_content_as_the_model_wrote_it(pieces: list[str], content: str) -> None:
    # cut off by max_tokens, or bad JSON: the reply was empty, its text only in the server's log
    events = run(QWEN, pieces)
    assert reassemble(events) == {"content": content, "reasoning": "", "tool_calls": []}


def test_name_event_precedes_arguments_and_ids_are_stable():
    events = run(QWEN, ['<tool_call>{"name": "f", "arguments": {}}</tool_call>'])
    assert [type(e) for e in events] == [ToolCallStart, ToolCallArguments]
    assert events[0].index == events[1].index == 0
    assert events[0].id == "call_0"
    assert json.loads(events[1].arguments) == {}


def test_default_ids_are_unique_call_ids():
    splitter = ChatOutputSplitter(QWEN)
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call>' * 2
    starts = [e for e in splitter.feed(text) + splitter.finish() if isinstance(e, ToolCallStart)]
    assert len({s.id for s in starts}) == 2
    assert all(s.id.startswith("call_") for s in starts)
    assert splitter.tool_calls == 2


def test_unterminated_valid_call_is_parsed_at_finish():
    result = reassemble(run(QWEN, ['<tool_call>{"name": "f", "arguments": {"a": 1}}']))
    assert result["tool_calls"] == [{"id": "call_0", "name": "f", "arguments": {"a": 1}}]


@pytest.mark.parametrize("cut", ["\n</tool", "\n</tool_", "\n<", ""])
def test_a_call_cut_off_inside_its_end_marker_is_parsed(cut: str) -> None:
    # max_tokens ending inside `</tool_call>`: the call was content, markup and all, unlike one cut just before it.
    result = reassemble(run(QWEN, ['<tool_call>\n{"name": "f", "arguments": {"a": 1}}' + cut]))
    assert result["tool_calls"] == [{"id": "call_0", "name": "f", "arguments": {"a": 1}}] and not result["content"]
    broken = reassemble(run(QWEN, ['<tool_call>\n{"name": "f", "argu' + cut]))
    assert broken["content"] == '<tool_call>\n{"name": "f", "argu' + cut  # as written


def test_broken_call_is_content_as_written():
    events = run(QWEN, ["ok <tool_call>{not json}</tool_call> after"])
    assert reassemble(events) == {"content": "ok <tool_call>{not json}</tool_call> after", "reasoning": "",
                                  "tool_calls": []}


def test_unterminated_reasoning_is_flushed_as_reasoning():
    assert reassemble(run(QWEN, ["<think>still thin", "king </thi"])) == {
        "content": "",
        "reasoning": "still thinking </thi",
        "tool_calls": [],
    }


class _Tokenizer:
    think_start, think_end = "<think>", "</think>"
    think_start_tokens, think_end_tokens = (7,), (8,)
    tool_call_start, tool_call_end = "<tool_call>", "</tool_call>"
    tool_parser = staticmethod(json_tools.parse_tool_call)


def test_markers_from_tokenizer_wrapper():
    markers = OutputMarkers.from_tokenizer(_Tokenizer())
    assert (markers.think_start, markers.tool_call_end) == ("<think>", "</tool_call>")
    assert markers.tool_parser is json_tools.parse_tool_call
    assert OutputMarkers.from_tokenizer(object()) == OutputMarkers()


def test_starts_in_reasoning_when_prompt_ends_in_open_think_block():
    tok = _Tokenizer()
    assert starts_in_reasoning(tok, [1, 2, 7, 3])
    assert not starts_in_reasoning(tok, [1, 7, 3, 8, 4])
    assert not starts_in_reasoning(tok, [1, 2, 3])
    assert not starts_in_reasoning(object(), [7])


# ------------------------------------------------------------------ a reply the token limit ended inside a call


def run_cut(markers: OutputMarkers, pieces: list[str], **kwargs) -> tuple[str, list[tuple[str, str]]]:
    """The content and the (name, arguments) calls of a reply max_tokens ended (finish(cut=True))."""
    splitter = ChatOutputSplitter(markers, **kwargs)
    events = [e for piece in pieces for e in splitter.feed(piece)] + splitter.finish(cut=True)
    return "".join(e.text for e in events if isinstance(e, ContentText)), joined_calls(events)


@pytest.mark.parametrize("text, expected", [
    # the probes' reply (max_tokens 15, a forced call): the call as written so far, no markup in content
    ('<tool_call>\n{"name": "add", "arguments":', ("", [("add", "")])),
    ('Sure. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": "tw', ("Sure. ", [("add", '{"a": 1, "b": "tw')])),
    # a complete first call, then a cut second: the first stays whole
    ('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>\n<tool_call>\n{"name": "sub", "arguments": {"b"',
     ("", [("add", '{"a": 1}'), ("sub", '{"b"')])),
    # no name to read: the reply ends with what was said before the call
    ('Sure. <tool_call>\n{"na', ("Sure. ", [])),
    ("Sure. <tool_call>", ("Sure. ", [])),
])
def test_a_call_the_token_limit_cut_is_a_call_at_every_split(text: str, expected: tuple[str, list]) -> None:
    for pieces in splits(text):
        assert run_cut(QWEN, pieces) == expected, pieces


def test_a_cut_call_in_tags_is_read_by_the_familys_parser() -> None:
    text = "<tool_call>\n<function=read>\n<parameter=path>\nsrc/ma"
    assert run_cut(CODER, [text]) == ("", [("read", '{"path": "src/ma')])


def test_a_forced_call_cut_before_its_name_has_the_forced_name() -> None:
    assert run_cut(QWEN, ['<tool_call>\n{"name": "ad'], forced_name="add") == ("", [("add", "")])


def test_an_opening_marker_the_limit_cut_is_markup_too() -> None:
    markers = OutputMarkers(tool_call_start="<tool_call>", tool_call_end="</tool_call>",
                            tool_parser=json_tools.parse_tool_call)
    assert run_cut(markers, ["Sure. <tool_c"]) == ("Sure. ", [])
    assert run(markers, ["Sure. <tool_c"]) == [ContentText("Sure. "), ContentText("<tool_c")]  # not cut: as written
