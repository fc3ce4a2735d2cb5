"""Tool-call formats mlx-lm does not infer: a set of named templates (Hermes 2 Pro / 3) is read by its `tool_use`
template, and Granite 3.x's `<|tool_call|>` JSON list is parsed — both came back as content before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.chat_output import OutputMarkers
from engine.tool_formats import fallback_tool_format, parse_json_list
from tests.fixtures.tiny_llm import build_tiny_llm


def _reply(tokenizer: Any, text: str) -> Any:
    from service.chat.output import ChatTranslator

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    translator = ChatTranslator.for_request(tokenizer, [], tools)
    for i in range(0, len(text), 5):
        translator.feed(text[i:i + 5])
    translator.finish()
    return translator.message()


def test_named_templates_give_the_tool_use_templates_format(hermes_tokenizer: Any) -> None:
    # mlx-lm found no parser
    assert isinstance(hermes_tokenizer.chat_template, dict) and hermes_tokenizer.tool_parser is None
    markers = OutputMarkers.from_tokenizer(hermes_tokenizer)
    assert (markers.tool_call_start, markers.tool_call_end) == ("<tool_call>", "</tool_call>")
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    message = _reply(hermes_tokenizer, call)
    assert message.content is None and [c.function.name for c in message.tool_calls or []] == ["get_weather"]


def test_granite_calls_are_a_json_list_after_the_marker(granite_tokenizer: Any) -> None:
    assert granite_tokenizer.tool_parser is None
    assert OutputMarkers.from_tokenizer(granite_tokenizer).tool_call_start == "<|tool_call|>"
    message = _reply(granite_tokenizer, '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                              '{"name": "get_weather", "arguments": {"city": "Rome"}}]')
    assert message.content is None
    assert [json.loads(c.function.arguments)["city"] for c in message.tool_calls or []] == ["Paris", "Rome"]
    broken = _reply(granite_tokenizer, '<|tool_call|>[{"name": "get_weather", "argu')
    assert broken.tool_calls is None and broken.content == '<|tool_call|>[{"name": "get_weather", "argu'


def test_other_templates_get_no_format_of_ours(tmp_path: Path) -> None:
    from engine.models import load_tokenizer

    assert fallback_tool_format(load_tokenizer(build_tiny_llm(tmp_path / "plain"))) is None
    with pytest.raises(ValueError):
        parse_json_list('"just a string"')
