"""What Claude Code 2.x sends /v1/messages (tests/fixtures/claude_code: its recorded requests, trimmed): a system
turn mid-conversation, `context_management` edits, `output_config.effort`, `thinking.display`, `?beta=true` on the
URL, each answered as Anthropic's API answers it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.messages.context_edits import CLEARED_RESULT
from service.state import AppState
from tests.service.chat.test_render import PLAIN, WITH_EFFORT, WITH_SWITCH, TemplateTokenizer
from tests.service.chat.test_routes import CallingTokenizer
from tests.service.fake_engine import FakeEngine
from tests.service.messages.test_routes import READS_ALL, TOOLS, USER, message_events

RECORDED = Path(__file__).parents[2] / "fixtures" / "claude_code"


def _recorded(name: str) -> dict[str, Any]:
    return json.loads((RECORDED / f"{name}.json").read_text())


def _client(tokenizer: Any, pieces: list[str] | None = None) -> Iterator[tuple[TestClient[Any], FakeEngine]]:
    engine = FakeEngine(pieces or ["<think>", "hmm", "</think>", "Hi!"], context_length=65536)
    engine.tokenizer = tokenizer
    with TestClient(create_app(AppState(engine=engine))) as http:
        yield http, engine


@pytest.fixture
def calling() -> Iterator[tuple[TestClient[Any], FakeEngine]]:
    yield from _client(CallingTokenizer())


@pytest.fixture
def reads_all() -> Iterator[tuple[TestClient[Any], FakeEngine]]:
    yield from _client(TemplateTokenizer(READS_ALL, markers=True, thinks=True), ["ok"])


def _post(http: TestClient[Any], path: str = "/v1/messages", **fields: Any) -> Any:
    return http.post(path, json={"model": "fake-model", "max_tokens": 64, "messages": USER, **fields})


def _replay(http: TestClient[Any], name: str) -> Any:
    """Send a recorded Claude Code request as it came (path, headers, body), to the served model; a 200."""
    recorded = _recorded(name)
    response = http.post(recorded["path"], headers=recorded["headers"],
                         json={**recorded["body"], "model": "fake-model"})
    assert response.status_code == 200, response.text
    return response


def _prompt_messages(engine: FakeEngine) -> list[dict[str, Any]]:
    """The messages of the last request's prompt render (the server also renders probes, shorter)."""
    return max(reversed([call["messages"] for call in engine.tokenizer.template_calls[-4:]]), key=len)


def test_claude_codes_first_request_is_answered_as_a_stream(calling: tuple[TestClient[Any], FakeEngine]) -> None:
    http, engine = calling
    response = _replay(http, "say_hi")
    events = message_events(response.text)
    assert [e["type"] for e in events][0] == "message_start" and events[-1]["type"] == "message_stop"
    blocks = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert blocks == ["thinking", "text"]
    delta = events[-2]
    assert delta["type"] == "message_delta" and delta["delta"]["stop_reason"] == "end_turn"
    # Its clear_thinking edit keeps all thinking: nothing applied, and said so.
    assert delta["context_management"] == {"applied_edits": []}
    assert events[0]["message"]["context_management"] is None
    # The system turn after the user's is read within that user turn, where Claude Code said it.
    prompt = engine.tokenizer.decode(engine.requests[-1].prompt_tokens)
    assert prompt.index("Claude Agent SDK") < prompt.index("say hi") < prompt.index("Available agent types")


def test_claude_codes_tool_result_turn_is_answered(calling: tuple[TestClient[Any], FakeEngine]) -> None:
    # Its second request: the reply's thinking and call back, the error result (cache_control on it) after them.
    http, engine = calling
    response = _replay(http, "tool_result")
    assert message_events(response.text)[-1]["type"] == "message_stop"
    prompt = engine.tokenizer.decode(engine.requests[-1].prompt_tokens)
    assert prompt.index("read the notes") < prompt.index("Available agent types") < prompt.index(
        "Error: <tool_use_error>Error: No such tool available: read")


def test_a_system_turn_first_joins_the_system_prompt_and_later_ones_the_user_turn_beside_them(
        reads_all: tuple[TestClient[Any], FakeEngine]) -> None:
    http, engine = reads_all
    history = [{"role": "system", "content": "Agents: a, b."}, *USER,
               {"role": "assistant", "content": "Sunny."}, {"role": "system", "content": [
                   {"type": "text", "text": "Skills: c."}]}, {"role": "user", "content": "Tomorrow?"}]
    assert _post(http, system="Be brief.", messages=history).status_code == 200
    assert _prompt_messages(engine) == [
        {"role": "system", "content": "Be brief.\n\nAgents: a, b."}, {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Skills: c.\n\nTomorrow?"}]


def _tool_history(*names: str) -> list[dict[str, Any]]:
    """A conversation of one call per tool name, each answered by a result naming its tool."""
    history: list[dict[str, Any]] = [*USER]
    for i, name in enumerate(names):
        history += [{"role": "assistant", "content": [
            {"type": "thinking", "thinking": f"think {i}", "signature": "s"},
            {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": {"n": i}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}",
                                          "content": f"result of {name} {i} " + "x" * 200}]}]
    return history


def test_clear_tool_uses_replaces_the_oldest_results_and_reports_it(
        reads_all: tuple[TestClient[Any], FakeEngine]) -> None:
    http, engine = reads_all
    tools = [{"name": n, "input_schema": {"type": "object"}} for n in ("Read", "Bash", "Grep")]
    edit = {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 500},
            "keep": {"type": "tool_uses", "value": 1}, "exclude_tools": ["Bash"], "clear_tool_inputs": ["Grep"]}
    history = _tool_history("Read", "Bash", "Grep", "Read")
    counted = http.post("/v1/messages/count_tokens?beta=true", json={
        "model": "fake-model", "messages": history, "tools": tools, "context_management": {"edits": [edit]}}).json()
    message = _post(http, messages=history, tools=tools, context_management={"edits": [edit]}).json()
    results = [m["content"] for m in _prompt_messages(engine) if m["role"] == "tool"]
    assert results[0] == results[2] == CLEARED_RESULT  # Read 0 and Grep 2; Bash is excluded, the last one kept
    assert results[1].startswith("result of Bash 1") and results[3].startswith("result of Read 3")
    calls = [m["tool_calls"][0]["function"]["arguments"] for m in _prompt_messages(engine) if m.get("tool_calls")]
    assert calls == [{"n": 0}, {"n": 1}, {}, {"n": 3}]  # Grep's input cleared too
    prompt = len(engine.requests[-1].prompt_tokens)
    (applied,) = message["context_management"]["applied_edits"]
    assert applied["type"] == "clear_tool_uses_20250919" and applied["cleared_tool_uses"] == 2
    assert counted["input_tokens"] == prompt
    assert applied["cleared_input_tokens"] == counted["context_management"]["original_input_tokens"] - prompt > 300


@pytest.mark.parametrize("edit", [
    {"trigger": {"type": "input_tokens", "value": 100_000}},  # the prompt is far below it
    {"trigger": {"type": "tool_uses", "value": 3}},  # 3 uses do not pass it
    {"trigger": {"type": "tool_uses", "value": 2}, "clear_at_least": {"type": "input_tokens", "value": 5000}},
    {"trigger": {"type": "tool_uses", "value": 2}, "keep": {"type": "tool_uses", "value": 3}},
])
def test_clear_tool_uses_leaves_the_conversation_below_its_trigger_or_threshold(
        reads_all: tuple[TestClient[Any], FakeEngine], edit: dict[str, Any]) -> None:
    http, engine = reads_all
    message = _post(http, messages=_tool_history("Read", "Read", "Read"), stream=True,
                    context_management={"edits": [{"type": "clear_tool_uses_20250919", **edit}]})
    assert message_events(message.text)[-2]["context_management"] == {"applied_edits": []}
    assert CLEARED_RESULT not in engine.tokenizer.decode(engine.requests[-1].prompt_tokens)


def test_clear_thinking_keeps_the_last_turns_thinking(reads_all: tuple[TestClient[Any], FakeEngine]) -> None:
    http, engine = reads_all
    history = _tool_history("Read", "Read", "Read")
    edits = [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}]
    events = message_events(_post(http, messages=history, stream=True, context_management={"edits": edits}).text)
    reasoning = [m.get("reasoning_content") for m in _prompt_messages(engine) if m["role"] == "assistant"]
    assert reasoning == [None, None, "think 2"]
    # This tokenizer's prompt writes no reasoning: clearing it cleared no prompt token, and says so.
    assert events[-2]["context_management"] == {"applied_edits": [
        {"type": "clear_thinking_20251015", "cleared_thinking_turns": 2, "cleared_input_tokens": 0}]}
    for keep in ("all", {"type": "all"}):
        edits = [{"type": "clear_thinking_20251015", "keep": keep}]
        message = _post(http, messages=history, context_management={"edits": edits}).json()
        assert message["context_management"] == {"applied_edits": []}
        reasoning = [m.get("reasoning_content") for m in _prompt_messages(engine) if m["role"] == "assistant"]
        assert reasoning == ["think 0", "think 1", "think 2"]


def test_a_request_without_context_management_has_none_in_its_reply(
        calling: tuple[TestClient[Any], FakeEngine]) -> None:
    http, engine = calling
    assert "context_management" not in _post(http).json()
    counted = http.post("/v1/messages/count_tokens?beta=true", json={"model": "fake-model", "messages": USER})
    assert counted.json() == {"input_tokens": len(engine.requests[-1].prompt_tokens)}


def test_output_config_effort_sets_the_templates_effort_or_switch() -> None:
    for template, kwarg, cases in [(WITH_EFFORT, "reasoning_effort", {"low": "low", "xhigh": "high", "max": "high"}),
                                   (WITH_SWITCH, "enable_thinking", {"low": True, "max": True})]:
        for http, engine in _client(TemplateTokenizer(template, thinks=True), ["ok"]):
            for effort, expected in cases.items():
                response = _post(http, thinking={"type": "adaptive"}, output_config={"effort": effort})
                assert response.status_code == 200, response.text
                assert engine.tokenizer.template_calls[-1][kwarg] == expected
            assert _post(http, thinking={"type": "disabled"}, output_config={"effort": "high"}).status_code == 200
            assert engine.tokenizer.template_calls[-1][kwarg] in ("none", False)
    for http, engine in _client(TemplateTokenizer(PLAIN), ["ok"]):  # a model that does not reason
        # Claude Code with thinking off (CLAUDE_CODE_DISABLE_THINKING) sends high, Anthropic's default: none asked.
        assert _post(http, output_config={"effort": "high"}).status_code == 200
        refused = _post(http, output_config={"effort": "low"})
        assert refused.status_code == 400 and "output_config.effort" in refused.json()["error"]["message"]


def test_thinking_display_omitted_sends_empty_thinking_blocks(calling: tuple[TestClient[Any], Any]) -> None:
    http, _ = calling
    thinking = {"type": "adaptive", "display": "omitted"}
    assert _post(http, thinking=thinking).json()["content"] == [
        {"type": "thinking", "thinking": "", "signature": ""}, {"type": "text", "text": "Hi!"}]
    events = message_events(_post(http, thinking=thinking, stream=True).text)
    assert [e["delta"]["type"] for e in events if e["type"] == "content_block_delta"] == ["text_delta"]


@pytest.mark.parametrize("fields, named", [
    ({"context_management": {"edits": [{"type": "compact_20260112"}]}}, "context_management"),
    ({"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": 2}]}}, "keep"),
    ({"output_config": {"effort": "extreme"}}, "effort"),
    ({"output_config": {"task_budget": {"type": "tokens", "total": 1000}}}, "task_budget"),
    ({"messages": [{"role": "system", "content": [{"type": "tool_result", "tool_use_id": "x"}]}, *USER]},
     "tool_result"),
])
def test_what_claude_code_may_send_and_cannot_be_honoured_is_named(calling: tuple[TestClient[Any], Any],
                                                                  fields: dict[str, Any], named: str) -> None:
    http, _ = calling
    response = _post(http, tools=TOOLS, **fields)
    assert response.status_code == 400, response.text
    assert named in response.json()["error"]["message"]


def test_an_edit_clears_only_what_it_changes_and_never_grows_the_prompt(
        reads_all: tuple[TestClient[Any], FakeEngine]) -> None:
    # A probe: results shorter than the placeholder grew the prompt 12k tokens and were still "applied", and a second
    # edit of the type reported the first's uses cleared again.
    http, engine = reads_all
    history = _tool_history("Read", "Read", "Read")
    for m in history:  # results of one word: the placeholder is longer
        for block in m["content"] if isinstance(m["content"], list) else ():
            if block["type"] == "tool_result":
                block["content"] = "R"
    edit = {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 1},
            "keep": {"type": "tool_uses", "value": 1}}
    message = _post(http, messages=history, context_management={"edits": [edit]}).json()
    assert message["context_management"] == {"applied_edits": []}
    assert CLEARED_RESULT not in engine.tokenizer.decode(engine.requests[-1].prompt_tokens)
    twice = _post(http, messages=_tool_history("Read", "Read", "Read"), context_management={"edits": [edit, edit]})
    assert twice.status_code == 400 and "context_management.edits" in twice.json()["error"]["message"], twice.text


@pytest.mark.parametrize("fields, named", [
    ({"metadata": {"user_id": "u" * 257}}, "metadata.user_id"),  # 100 KB of it went whole into the access log
    ({"thinking": {"type": "disabled", "budget_tokens": 5000}}, "thinking: budget_tokens"),  # was dropped silently
    ({"stop_sequences": ["stop", ""]}, "stop_sequences"),
    ({"messages": [{"role": "user", "content": ""}]}, "messages.0: all messages"),  # was "messages: List should..."
    ({"messages": [*USER, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}]},
     "messages.1.content.1"),  # chat's words before: tool_calls, tool_call_id
])
def test_what_a_hostile_client_sends_is_refused_by_name(calling: tuple[TestClient[Any], Any], fields: dict[str, Any],
                                                       named: str) -> None:
    http, _ = calling
    response = _post(http, tools=TOOLS, **fields)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert message.startswith(named) and "tool_call" not in message, message
