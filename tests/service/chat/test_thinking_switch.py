"""service/chat/thinking_switch.py with the route: vLLM's and SGLang's top-level `enable_thinking` and `thinking`, as
Dify's OpenAI-API-compatible plugin sends them in its extended mode, switch the template's thinking as
reasoning_effort does; fields that disagree, a budget and a format that leaves the thinking in content are refused by
name."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.state import AppState
from tests.service.chat.test_harmony_replies import HarmonyTokenizer
from tests.service.chat.test_render import PLAIN, WITH_EFFORT, WITH_SWITCH, TemplateTokenizer
from tests.service.conftest import sse_events
from tests.service.fake_engine import FakeEngine, FakeTokenizer

USER = [{"role": "user", "content": "Hello"}]
THOUGHT = ["hmm", "</think>", "Hi."]
# What Dify's plugin sends with thinking off (its extended mode, for vLLM and SGLang).
DIFY_OFF = {"chat_template_kwargs": {"enable_thinking": False, "thinking": False}, "thinking": {"type": "disabled"},
            "enable_thinking": False}
DIFY_ON = {"chat_template_kwargs": {"enable_thinking": True, "thinking": True}, "thinking": {"type": "enabled"},
           "enable_thinking": True}


class SwitchTokenizer(TemplateTokenizer):
    """A Qwen3-like model: its template reads `enable_thinking` (on unless false), and its generation prompt then
    opens a think block."""

    def __init__(self) -> None:
        super().__init__(WITH_SWITCH, thinks=True)
        self.think_start_tokens, self.think_end_tokens = tuple(self.encode("<think>")), tuple(self.encode("</think>"))

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: Any = None, *, tokenize: bool = True,
                            **kwargs: Any) -> list[int] | str:
        text = super().apply_chat_template(messages, tools, tokenize=False, **kwargs)
        assert isinstance(text, str)
        if kwargs.get("add_generation_prompt") and kwargs.get("enable_thinking", True):
            text += "<think>\n"
        return self.encode(text) if tokenize else text


def _client(tokenizer: FakeTokenizer, pieces: list[str]) -> Iterator[tuple[TestClient[Any], FakeEngine]]:
    engine = FakeEngine(pieces, context_length=4096)
    engine.tokenizer = tokenizer
    with TestClient(create_app(AppState(engine=engine))) as client:
        yield client, engine


def _post(client: TestClient[Any], **body: Any) -> Any:
    return client.post("/v1/chat/completions", json={"messages": USER, **body})


def _message(client: TestClient[Any], **body: Any) -> dict[str, Any]:
    response = _post(client, **body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]


def _refused(response: Any, param: str, words: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["code"] != "unknown_parameter", error
    assert words in error["message"], error


def test_difys_streamed_request_with_thinking_off_is_served_with_the_switch_off() -> None:
    # The plugin's request, as reported: a 400 "Unrecognized request arguments supplied: enable_thinking, thinking".
    for client, engine in _client(SwitchTokenizer(), ["Hi", " there."]):
        response = _post(client, max_tokens=40, stream=True, stream_options={"include_usage": True}, **DIFY_OFF)
        assert response.status_code == 200, response.text
        events = sse_events(response.text)
        deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
        assert "".join(d.get("content") or "" for d in deltas) == "Hi there."
        assert not any(d.get("reasoning_content") for d in deltas)
        assert events[-2]["usage"]["completion_tokens"] == 2 and events[-1] == "[DONE]"
        call = engine.tokenizer.template_calls[-1]
        assert call["enable_thinking"] is False and call["thinking"] is False


@pytest.mark.parametrize("body", [{"enable_thinking": False}, {"thinking": {"type": "disabled"}}, DIFY_OFF])
def test_the_switch_off_reaches_the_template_as_reasoning_effort_none_does(body: dict[str, Any]) -> None:
    for client, engine in _client(SwitchTokenizer(), ["Hi."]):
        assert _message(client, **body) == {"role": "assistant", "content": "Hi."}
        assert engine.tokenizer.template_calls[-1]["enable_thinking"] is False


@pytest.mark.parametrize("body", [{"enable_thinking": True}, {"thinking": {"type": "enabled"}}, DIFY_ON,
                                  {"thinking": {"type": "enabled", "budget_tokens": None}, "reasoning_effort": "high",
                                   "reasoning_format": "deepseek"}])
def test_the_switch_on_opens_the_think_block_and_the_thinking_is_reasoning_content(body: dict[str, Any]) -> None:
    for client, engine in _client(SwitchTokenizer(), THOUGHT):
        message = _message(client, **body)
        assert message["reasoning_content"] == "hmm" and message["content"] == "Hi."
        assert engine.tokenizer.template_calls[-1]["enable_thinking"] is True


@pytest.mark.parametrize("body, expected", [
    ({"enable_thinking": False}, {"reasoning_effort": "none"}),
    ({"thinking": {"type": "enabled"}}, {}),  # on, at the template's own effort
    ({"enable_thinking": True, "reasoning_effort": "low"}, {"reasoning_effort": "low"}),
])
def test_a_template_that_reads_an_effort_gets_none_or_its_own(body: dict[str, Any], expected: dict[str, Any]) -> None:
    for client, engine in _client(TemplateTokenizer(WITH_EFFORT, thinks=True), ["ok"]):
        _message(client, **body)
        call = engine.tokenizer.template_calls[-1]
        assert {k: call[k] for k in ("enable_thinking", "reasoning_effort") if k in call} == expected


@pytest.mark.parametrize("body, param, words", [
    ({"enable_thinking": False, "reasoning_effort": "high"}, "enable_thinking", "reasoning_effort 'high'"),
    ({"enable_thinking": True, "reasoning_effort": "none"}, "enable_thinking", "reasoning_effort 'none'"),
    ({"enable_thinking": True, "chat_template_kwargs": {"enable_thinking": False}}, "enable_thinking",
     "chat_template_kwargs.enable_thinking is false"),
    ({"enable_thinking": False, "chat_template_kwargs": {"thinking": True}}, "enable_thinking",
     "chat_template_kwargs.thinking is true"),
    ({"thinking": {"type": "disabled"}, "enable_thinking": True}, "thinking", "enable_thinking is true"),
    ({"thinking": {"type": "enabled"}, "reasoning_effort": "none"}, "thinking", "reasoning_effort 'none'"),
    ({**DIFY_OFF, "thinking": {"type": "enabled"}}, "thinking", "switches thinking on"),
])
def test_fields_that_disagree_are_refused_by_name(body: dict[str, Any], param: str, words: str) -> None:
    for client, engine in _client(SwitchTokenizer(), ["ok"]):
        _refused(_post(client, **body), param, words)
        assert not engine.requests


@pytest.mark.parametrize("thinking, param, words", [
    ({"type": "adaptive"}, "thinking.type", "'enabled' or 'disabled'"),
    ({"type": "enabled", "budget_tokens": 2048}, "thinking.budget_tokens", "no reasoning budget"),
    ({"type": "disabled", "effort": "high"}, "thinking", "'effort' is not supported"),
    ({}, "thinking.type", "required"),
])
def test_a_thinking_object_this_server_cannot_honour_is_refused_by_name(thinking: dict[str, Any], param: str,
                                                                        words: str) -> None:
    for client, engine in _client(SwitchTokenizer(), ["ok"]):
        _refused(_post(client, thinking=thinking), param, words)
        assert not engine.requests


@pytest.mark.parametrize("value, served", [("auto", True), ("deepseek", True), ("none", False),
                                           ("deepseek-legacy", False), ("raw", False)])
def test_a_reasoning_format_is_taken_where_the_thinking_goes_to_reasoning_content(value: str, served: bool) -> None:
    for client, engine in _client(SwitchTokenizer(), THOUGHT):
        response = _post(client, reasoning_format=value)
        if served:
            assert response.status_code == 200, response.text
            assert response.json()["choices"][0]["message"]["reasoning_content"] == "hmm"
        else:
            _refused(response, "reasoning_format", repr(value))
            assert not engine.requests


@pytest.mark.parametrize("thinks, body, param, words", [
    (True, {"enable_thinking": False}, "enable_thinking", "no switch to turn that off"),
    (False, {"thinking": {"type": "enabled"}}, "thinking.type", "does not reason"),
])
def test_a_switch_the_template_cannot_take_is_refused_naming_it(thinks: bool, body: dict[str, Any], param: str,
                                                               words: str) -> None:
    for client, engine in _client(TemplateTokenizer(PLAIN, thinks=thinks), ["ok"]):
        _refused(_post(client, **body), param, words)
        assert not engine.requests


def test_a_model_that_does_not_think_serves_difys_request_with_thinking_off() -> None:
    # SmolLM2's template reads no switch: thinking is off already.
    for client, engine in _client(TemplateTokenizer(PLAIN), ["Hi."]):
        assert _message(client, **DIFY_OFF)["content"] == "Hi."


def test_gpt_oss_thinks_at_its_own_effort_and_its_thinking_cannot_be_switched_off() -> None:
    for client, engine in _client(HarmonyTokenizer(), ["<|channel|>final<|message|>Hi."]):
        assert _message(client, enable_thinking=True)["content"] == "Hi."
        _refused(_post(client, thinking={"type": "disabled"}), "thinking.type", "cannot be switched off")


def test_without_a_chat_template_the_switch_is_refused_naming_it() -> None:
    tokenizer = FakeTokenizer()
    tokenizer.has_chat_template = False
    for client, engine in _client(tokenizer, ["ok"]):
        _refused(_post(client, enable_thinking=False), "enable_thinking", "no chat template")


@pytest.mark.parametrize("body, param", [
    # a string "false" reached the template beside the switch, which read it as true: thinking stayed on
    ({"enable_thinking": False, "chat_template_kwargs": {"enable_thinking": "false"}}, "enable_thinking"),
    ({"thinking": {"type": "disabled"}, "chat_template_kwargs": {"thinking": "false"}}, "thinking"),
    # reasoning_effort beside a chat_template_kwargs switch that disagrees: the kwarg won silently
    ({"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": "false"}}, "reasoning_effort"),
    ({"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}}, "reasoning_effort"),
    ({"reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": False}}, "reasoning_effort"),
])
def test_a_template_switch_beside_a_request_switch_must_agree_as_a_boolean(body: dict[str, Any], param: str) -> None:
    for client, engine in _client(TemplateTokenizer(PLAIN, thinks=True), ["ok"]):
        response = _post(client, **body)
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == param, response.text
        assert f"but chat_template_kwargs.{next(iter(body['chat_template_kwargs']))} is" in error["message"], error
        assert not engine.requests
    for client, engine in _client(TemplateTokenizer(PLAIN), ["ok"]):  # agreeing, both ways: taken
        for effort, switch in (("none", False), ("high", True)):
            agreeing = _post(client, reasoning_effort=effort, chat_template_kwargs={"enable_thinking": switch})
            assert "but chat_template_kwargs" not in agreeing.text, agreeing.text
