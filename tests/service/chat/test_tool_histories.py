"""An agent's earlier calls and results rendered in the model's own format: Hermes' `tool_use` template renders
them itself (they were rewritten as user <tool_response> turns), Granite's calls go back as `<|tool_call|>` and a
JSON list (they went back as Hermes-style <tool_call> blocks its template never asks for)."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.state import AppState
from tests.engine.test_tool_formats import build_granite, build_hermes
from tests.service.fake_engine import FakeEngine

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
HISTORY = [
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]


@pytest.fixture(scope="module")
def hermes(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_hermes(tmp_path_factory.mktemp("hermes"))


@pytest.fixture(scope="module")
def granite(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_granite(tmp_path_factory.mktemp("granite"))


def _prompt(tokenizer: Any) -> str:
    engine = FakeEngine(["ok"], context_length=4096)
    engine.tokenizer = tokenizer
    with TestClient(create_app(AppState(engine=engine))) as client:
        response = client.post("/v1/chat/completions", json={"messages": HISTORY, "tools": TOOLS})
    assert response.status_code == 200, response.text
    return str(tokenizer.decode(engine.requests[-1].prompt_tokens))


def test_a_tool_use_template_renders_the_history_itself(hermes: Any) -> None:
    prompt = _prompt(hermes)
    assert '<tool_call>\n{"name": "get_weather"}\n</tool_call>' in prompt  # written by the template
    assert "<|im_start|>tool\nsunny" in prompt and "<tool_response>" not in prompt


def test_granite_calls_go_back_as_its_json_list(granite: Any) -> None:
    prompt = _prompt(granite)
    assert '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]' in prompt
    assert "<tool_call>" not in prompt
