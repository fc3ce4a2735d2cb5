"""What /v1/responses refuses, each by the field it names, and the Codex request it must take as Codex sends it."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import TestClient

from tests.service.fake_engine import FakeEngine

# A Codex CLI turn as its source builds one (codex-rs ResponsesApiRequest), shortened: what must be taken.
CODEX_TURN: dict[str, Any] = {
    "model": "fake-model", "instructions": "You are Codex, a coding agent.",
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": None, "encrypted_content": None},
        {"type": "function_call", "id": "fc_1", "name": "shell_command", "arguments": "{\"command\":\"ls\"}",
         "call_id": "call_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "Exit code: 0\nREADME.md"},
    ],
    "tools": [{"type": "function", "name": "shell_command", "description": "Runs a command.", "strict": False,
               "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                              "required": ["command"], "additionalProperties": False}},
              {"type": "web_search", "external_web_access": False}],
    "tool_choice": "auto", "parallel_tool_calls": False, "reasoning": None, "store": False, "stream": True,
    "include": [], "prompt_cache_key": "0199a1b2-thread", "client_metadata": {"x-codex-window-id": "w1"},
}


def test_a_codex_turn_is_served(client: TestClient[Any], fake_engine: FakeEngine) -> None:
    fake_engine.context_length = 4096
    response = client.post("/v1/responses", json=CODEX_TURN, headers={"originator": "codex_cli_rs"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    assert "event: response.completed" in response.text
    assert fake_engine.requests[-1].session_id == "0199a1b2-thread"


@pytest.mark.parametrize("change, param", [
    ({"conversation": "conv_1"}, "conversation"),
    ({"background": True}, "background"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]}, "input.0.content"),
    ({"input": []}, "input"),
    ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"tool_choice": "required", "tools": [{"type": "function", "name": "f"}]}, "tool_choice"),  # the fake's format
    ({"tool_choice": {"type": "function", "name": "g"}, "tools": [{"type": "function", "name": "f"}]}, "tool_choice"),
    ({"tools": [{"type": "function", "name": "f", "strict": True}]}, "tools.0.strict"),
    ({"tools": [{"type": "custom", "name": "p", "format": {"type": "json"}}]}, "tools.0.format.type"),
    ({"tools": [{"type": "teleport"}]}, "tools.0"),
    ({"include": ["file_search_call.results"]}, "include"),
    ({"truncation": "auto"}, "truncation"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"max_tool_calls": -1}, "max_tool_calls"),
    ({"max_tool_calls": 0, "tool_choice": "required", "tools": [{"type": "function", "name": "f"}]}, "max_tool_calls"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"stream_options": {"include_obfuscation": True}}, "stream_options.include_obfuscation"),
    ({"frequency_penalty": 3.0}, "frequency_penalty"),
    ({"logit_bias": {"65": -100}}, "logit_bias"),
    ({"reasoning": {"effort": "bogus"}}, "reasoning.effort"),
])
def test_what_cannot_be_honoured_is_refused_by_name(client: TestClient[Any], fake_engine: FakeEngine,
                                                    change: dict[str, Any], param: str) -> None:
    response = client.post("/v1/responses", json={"input": "hi", **change})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert not fake_engine.requests


def test_an_unknown_model_is_a_404(client: TestClient[Any]) -> None:
    response = client.post("/v1/responses", json={"input": "hi", "model": "gpt-5"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"


def test_responses_without_v1_points_at_it(client: TestClient[Any]) -> None:
    response = client.post("/responses", json={"input": "hi"})
    assert response.status_code == 404 and "/v1/responses" in response.json()["error"]["message"]


def test_allowed_tools_is_refused_for_what_it_is(client: TestClient[Any]) -> None:
    # It was refused as "a forced tool call", which mode "auto" is not.
    choice = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "f"}]}
    error = client.post("/v1/responses", json={"input": "hi", "tool_choice": choice}).json()["error"]
    assert error["param"] == "tool_choice"
    assert error["message"].startswith("tool_choice: allowed_tools is not supported")


@pytest.mark.parametrize("change, param, words", [
    ({"truncation": "auto"}, "truncation", "truncation: 'auto' is not offered: an input longer than the model's "
                                           "context is refused with context_length_exceeded, never cut"),
    ({"text": {"verbosity": "low"}}, "text.verbosity", "text.verbosity: 'low' is not offered: replies are as long "
                                                       "as the model makes them"),
    # VS Code Copilot Chat's Responses requests (an experiment setting): a bare unknown_parameter said nothing
    ({"context_management": [{"type": "compaction", "compact_threshold": 7000}]}, "context_management",
     "context_management: 'compaction' is not offered: nothing is compacted here"),
])
def test_a_setting_not_offered_says_what_happens_instead(client: TestClient[Any], change: dict[str, Any], param: str,
                                                         words: str) -> None:
    # pydantic's "Input should be 'disabled'" said neither what is not offered nor what happens instead.
    error = client.post("/v1/responses", json={"input": "hi", **change}).json()["error"]
    assert error["param"] == param and error["code"] == "invalid_value" and error["message"].startswith(words), error
    for offered in ({"truncation": "disabled"}, {"text": {"verbosity": "medium"}}, {"context_management": []},
                    {"context_management": None}):
        assert client.post("/v1/responses", json={"input": "hi", **offered}).status_code == 200
