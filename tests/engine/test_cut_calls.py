"""read_cut_block: what a call block the token limit cut says — its name and the arguments written so far, for
calls written as JSON, as tags and as a header before JSON; nothing when no name can be read."""

from __future__ import annotations

from typing import Any

import pytest

from engine.cut_calls import CutBlock, read_cut_block, read_json_calls
from mlx_lm.tool_parsers import glm47, json_tools, kimi_k2, minimax_m2, mistral, pythonic, qwen3_coder

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "sub"}}]


@pytest.mark.parametrize("block, parser, expected", [
    # JSON calls (Hermes, Qwen 2.5/3, SmolLM, a prompt's <tool_call> JSON): the probe's block, then deeper cuts
    ('\n{"name": "add", "arguments":', json_tools, CutBlock([], ("add", ""))),
    ('\n{"name": "add", "arguments": {"a": 1, "b": "fo', json_tools, CutBlock([], ("add", '{"a": 1, "b": "fo'))),
    ('{"arguments": {"a": {"name": "x"}}, "name": "add"', json_tools, CutBlock([], ("add", '{"a": {"name": "x"}}'))),
    ('{"name": "add", "arguments": {"a": 1}, "id"', json_tools, CutBlock([], ("add", '{"a": 1}'))),
    # Granite's and Mistral's lists: the calls written whole before the cut one stay whole
    ('[{"name": "add", "arguments": {"a": 1}}, {"name": "add", "arguments": {"a": 2', mistral,
     CutBlock([{"name": "add", "arguments": {"a": 1}}], ("add", '{"a": 2'))),
    # Tags (Qwen3-Coder, MiniMax, GLM): the family's parser over the block with its open tags closed; a string
    # value the cut came inside is left open, as its JSON would be
    ("\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\nfo", qwen3_coder,
     CutBlock([], ("add", '{"a": 1, "b": "fo'))),
    ("\n<function=add>\n<parameter=a>\n1\n</param", qwen3_coder, CutBlock([], ("add", '{"a": 1'))),
    ("\n<function=add>\n", qwen3_coder, CutBlock([], ("add", "{"))),
    # a tag opened inside a value is the value's text, not one to close
    ("<function=add>\n<parameter=b>\nList<String> x = <b>y</b> <br>z", qwen3_coder,
     CutBlock([], ("add", '{"b": "List<String> x = <b>y</b> <br>z'))),
    ('<invoke name="add">\n<parameter name="a">1</parameter>\n<parameter name="b">x', minimax_m2,
     CutBlock([], ("add", '{"a": 1, "b": "x'))),
    ("add<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>b</arg_key><arg_value>fo", glm47,
     CutBlock([], ("add", '{"a": 1, "b": "fo'))),
    # A header then JSON (Mistral's `name[ARGS]{...}`): the parser reads the name with `{}` for the arguments
    ('add[ARGS]{"a": 1, "b": "x', mistral, CutBlock([], ("add", '{"a": 1, "b": "x'))),
    ('add[ARGS]{"a": 1}sub[ARGS]{"b', mistral, CutBlock([{"name": "add", "arguments": {"a": 1}}], ("sub", '{"b'))),
    ("add[ARGS]", mistral, CutBlock([], ("add", ""))),
])
def test_a_cut_call_is_read_with_its_arguments_so_far(block: str, parser: Any, expected: CutBlock) -> None:
    assert read_cut_block(block, parser.parse_tool_call, TOOLS) == expected


@pytest.mark.parametrize("block, parser", [
    ('\n{"name": "ad', json_tools),  # the name itself was cut
    ("", json_tools),
    ("\n<function=ad", qwen3_coder),
    ("[add(a=1, b=", pythonic),
    # a parser run on text it was not written for reads a name no tool has (`<|tool_call_begin|>functions.add`)
    ('<|tool_call_begin|>functions.add:0<|tool_call_argument_begin|>{"a"', kimi_k2),
    ('mul[ARGS]{"a": 1', mistral),
])
def test_no_name_no_call(block: str, parser: Any) -> None:
    assert read_cut_block(block, parser.parse_tool_call, TOOLS) == CutBlock()


@pytest.mark.parametrize("block, expected", [
    ('\n{"name": "ad', ("add", "")),
    ("", ("add", "")),
    ('{"name": "add", "arguments": {"a": 1', ("add", '{"a": 1')),  # a name written is the name read
])
def test_a_forced_calls_name_stands_for_one_the_cut_left_unwritten(block: str, expected: tuple[str, str]) -> None:
    assert read_cut_block(block, json_tools.parse_tool_call, TOOLS, forced_name="add") == CutBlock([], expected)


def test_json_objects_one_after_another_as_llama_writes_them() -> None:
    read = read_json_calls('{"name": "add", "parameters": {"a": 1}}; {"name": "add", "parameters": {"b": "x\\"y')
    assert read == CutBlock([{"name": "add", "parameters": {"a": 1}}], ("add", '{"b": "x\\"y'))
