"""Tool-call formats mlx-lm does not infer: a set of named templates (Hermes 2 Pro / 3) is read by its `tool_use`
template, and Granite 3.x's `<|tool_call|>` JSON list is parsed — both came back as content before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.chat_output import OutputMarkers
from engine.tool_formats import fallback_tool_format, parse_json_list
from tests.fixtures.tiny_llm import CHATML_TEMPLATE, build_tiny_llm

# Templates of our own in each family's shape.
HERMES_TOOL_USE = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- for tool_call in m.tool_calls or [] %}{%- set tool_call = tool_call.function %}"
    "<tool_call>\n{\"name\": \"{{ tool_call.name }}\"}\n</tool_call>"
    "{%- endfor %}<|im_end|>\n{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
GRANITE = (
    "{%- if tools %}<|start_of_role|>system<|end_of_role|>When a tool is required, respond only with <|tool_call|> "
    "followed by a JSON list of tools used.<|end_of_text|>{%- endif %}"
    "{%- for m in messages %}<|start_of_role|>{{ m.role }}<|end_of_role|>{{ m.content }}<|end_of_text|>"
    "{%- endfor %}{%- if add_generation_prompt %}<|start_of_role|>assistant<|end_of_role|>{%- endif %}"
)


def _tokenizer(path: Path) -> Any:
    from engine.models import load_tokenizer

    return load_tokenizer(path)


def build_hermes(path: Path) -> Any:
    """A tiny checkpoint with Hermes' named templates (`default` and `tool_use`); its tokenizer."""
    path = build_tiny_llm(path, extra_special_tokens=("<tool_call>", "</tool_call>"))
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": CHATML_TEMPLATE},
                               {"name": "tool_use", "template": HERMES_TOOL_USE}]
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return _tokenizer(path)


def build_granite(path: Path) -> Any:
    """A tiny checkpoint with a template in Granite 3.x's shape and `<|tool_call|>` in its vocabulary."""
    return _tokenizer(build_tiny_llm(path, extra_special_tokens=("<|tool_call|>",), chat_template=GRANITE))


@pytest.fixture(scope="module")
def hermes(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_hermes(tmp_path_factory.mktemp("hermes"))


@pytest.fixture(scope="module")
def granite(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_granite(tmp_path_factory.mktemp("granite"))


def _reply(tokenizer: Any, text: str) -> Any:
    from service.chat.output import ChatTranslator

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    translator = ChatTranslator.for_request(tokenizer, [], tools)
    for i in range(0, len(text), 5):
        translator.feed(text[i:i + 5])
    translator.finish()
    return translator.message()


def test_named_templates_give_the_tool_use_templates_format(hermes: Any) -> None:
    assert isinstance(hermes.chat_template, dict) and hermes.tool_parser is None  # mlx-lm found none
    markers = OutputMarkers.from_tokenizer(hermes)
    assert (markers.tool_call_start, markers.tool_call_end) == ("<tool_call>", "</tool_call>")
    message = _reply(hermes, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    assert message.content is None and [c.function.name for c in message.tool_calls or []] == ["get_weather"]


def test_granite_calls_are_a_json_list_after_the_marker(granite: Any) -> None:
    assert granite.tool_parser is None
    assert OutputMarkers.from_tokenizer(granite).tool_call_start == "<|tool_call|>"
    message = _reply(granite, '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                              '{"name": "get_weather", "arguments": {"city": "Rome"}}]')
    assert message.content is None
    assert [json.loads(c.function.arguments)["city"] for c in message.tool_calls or []] == ["Paris", "Rome"]
    broken = _reply(granite, '<|tool_call|>[{"name": "get_weather", "argu')
    assert broken.tool_calls is None and broken.content == '<|tool_call|>[{"name": "get_weather", "argu'


def test_other_templates_get_no_format_of_ours(tmp_path: Path) -> None:
    assert fallback_tool_format(_tokenizer(build_tiny_llm(tmp_path / "plain"))) is None
    with pytest.raises(ValueError):
        parse_json_list('"just a string"')
