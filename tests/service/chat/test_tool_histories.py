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
