"""An agent's earlier calls and results rendered in the model's own format: Hermes' `tool_use` template renders
them itself (they were rewritten as user <tool_response> turns), Granite's calls go back as `<|tool_call|>` and a
JSON list (they went back as Hermes-style <tool_call> blocks its template never asks for)."""

from __future__ import annotations

from typing import Any

from tests.service.fake_engine import rendered_prompt

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
HISTORY = [
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]


def test_a_tool_use_template_renders_the_history_itself(hermes_tokenizer: Any) -> None:
    prompt = rendered_prompt(hermes_tokenizer, {"messages": HISTORY, "tools": TOOLS})
    assert '<tool_call>\n{"name": "get_weather"}\n</tool_call>' in prompt  # written by the template
    assert "<|im_start|>tool\nsunny" in prompt and "<tool_response>" not in prompt


def test_granite_calls_go_back_as_its_json_list(granite_tokenizer: Any) -> None:
    prompt = rendered_prompt(granite_tokenizer, {"messages": HISTORY, "tools": TOOLS})
    assert '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]' in prompt
    assert "<tool_call>" not in prompt


# DeepSeek-R1-Distill's shape: no `tools` variable (this server describes them), calls written only for an
# assistant turn without text, in its own markers.
R1_LIKE = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.content is none %}<A>{%- for c in m.tool_calls %}<|call|>{{ c.function.name }}"
    "{%- endfor %}<end>"
    "{%- elif m.role == 'assistant' %}<A>{{ m.content }}<end>"
    "{%- elif m.role == 'tool' %}<|output|>{{ m.content }}"
    "{%- else %}<{{ m.role }}>{{ m.content }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<A>{%- endif %}"
)


def test_calls_go_back_as_the_tools_description_asks_where_the_server_describes_the_tools(
        tmp_path_factory: Any) -> None:
    # R1's template dropped the calls of a turn with text (Codex's "Looking." before a call): the model never saw
    # them, and it was told to write <tool_call> blocks, not R1's own markers.
    from engine.models import load_tokenizer
    from tests.fixtures.tiny_llm import build_tiny_llm

    tokenizer = load_tokenizer(build_tiny_llm(tmp_path_factory.mktemp("r1"), chat_template=R1_LIKE))
    history = [HISTORY[0], {**HISTORY[1], "content": "Checking."}, HISTORY[2]]
    prompt = rendered_prompt(tokenizer, {"messages": history, "tools": TOOLS})
    assert 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt and "<|call|>" not in prompt
