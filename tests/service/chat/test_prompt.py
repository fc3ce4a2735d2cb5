"""service/chat/prompt.py: where the tool block goes for a template that does not take tools, the plain
rendering without a template, tool results paired with their calls by id, and speaker names."""

from __future__ import annotations

from typing import Any

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from service.chat.prompt import (
    MessageError,
    named_roles,
    render_text,
    results_in_call_order,
    takes_tools,
    template_messages,
)
from service.chat.schemas import ChatMessage
from service.chat.tool_text import calls_as_text, with_tool_prompt

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
USER = {"role": "user", "content": "weather?"}


class NoTemplate:
    has_chat_template = False


def test_in_user_turn_opens_the_first_user_turn_unless_there_is_a_system_message() -> None:
    history = [{"role": "assistant", "content": "hi"}, USER, {"role": "user", "content": "again"}]
    out = with_tool_prompt(history, TOOLS, in_user_turn=True)
    assert out[0] == history[0] and out[2] == history[2]
    assert out[1]["role"] == "user" and out[1]["content"].startswith("# Tools")
    assert out[1]["content"].endswith("</tool_call>\n\nweather?")
    # No user turn: one is added first; a client's system message takes the block all the same.
    assert with_tool_prompt([], TOOLS, in_user_turn=True)[0]["role"] == "user"
    system = with_tool_prompt([{"role": "system", "content": "Be brief."}, USER], TOOLS, in_user_turn=True)
    assert system[0]["content"].startswith("Be brief.\n\n# Tools") and system[1] == USER


@pytest.mark.parametrize("keeps", ["first", "last"])
def test_the_tools_survive_a_template_that_keeps_one_of_several_system_turns(keeps: str) -> None:
    # DeepSeek-R1's template keeps only the last system message: the tools went into the first and were lost.
    history = [{"role": "system", "content": "Be brief."}, {"role": "system", "content": "Use French."}, USER]
    out = with_tool_prompt(history, TOOLS)
    kept = [m for m in out if m["role"] == "system"][0 if keeps == "first" else -1]
    assert kept["content"].startswith("Be brief.\n\nUse French.\n\n# Tools") and "get_weather" in kept["content"]
    assert out[1:] == [USER]


def test_without_a_template_tools_are_not_dropped() -> None:
    assert not takes_tools(NoTemplate(), None)
    text, special = render_text(NoTemplate(), [USER], TOOLS)
    assert special and text.startswith("system: # Tools") and '"get_weather"' in text
    assert text.endswith("user: weather?\nassistant: ")


CALLS = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_Berlin", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Berlin"}}},
    {"id": "call_Munich", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Munich"}}}]}


def _result(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def test_tool_results_are_put_in_the_order_of_the_calls_they_answer() -> None:
    # Valid for OpenAI, which pairs by id; templates and <tool_response> blocks pair by position.
    berlin, munich = _result("call_Berlin", "snowy"), _result("call_Munich", "sunny")
    reversed_ = [USER, CALLS, munich, berlin, {"role": "user", "content": "and Berlin?"}]
    assert results_in_call_order(reversed_) == [USER, CALLS, berlin, munich, reversed_[-1]]
    in_order = [USER, CALLS, berlin, munich]
    assert results_in_call_order(in_order) == in_order
    # Calls sharing an id are answered in turn.
    twins = dict(CALLS, tool_calls=[dict(c, id="call_0") for c in CALLS["tool_calls"]])
    assert results_in_call_order([USER, twins, _result("call_0", "a"), _result("call_0", "b")])[2:] == [
        _result("call_0", "a"), _result("call_0", "b")]


@pytest.mark.parametrize("messages, param, words", [
    ([USER, CALLS, _result("call_Munich", "x"), _result("call_Paris", "y")], "messages.3.tool_call_id",
     "Invalid parameter: 'tool_call_id' of 'call_Paris' not found in 'tool_calls' of previous message."),
    ([USER, _result("call_q", "x")], "messages.1.tool_call_id",
     "messages with role 'tool' must be a response to a preceding message with 'tool_calls'"),
    # A result after another turn answers nothing: its calls were left unanswered first.
    ([USER, CALLS, _result("call_Berlin", "x"), USER, _result("call_Munich", "y")], "messages.1.tool_calls",
     "The following tool_call_ids did not have response messages: call_Munich"),
    ([USER, CALLS], "messages.1.tool_calls", "did not have response messages: call_Berlin, call_Munich"),
    ([USER, CALLS, _result("call_Berlin", "x"), _result("call_Berlin", "y")], "messages.3.tool_call_id",
     "'call_Berlin' answers a call an earlier tool message answered"),
    ([USER, dict(CALLS, tool_calls=[dict(CALLS["tool_calls"][0], id=None)]), _result("call_Berlin", "x")],
     "messages.1.tool_calls.0.id", "a tool call needs an id"),
])
def test_tool_results_that_do_not_answer_their_calls_are_refused_as_openai_refuses_them(
        messages: list[dict[str, Any]], param: str, words: str) -> None:
    with pytest.raises(MessageError) as refused:
        results_in_call_order(messages)
    assert refused.value.param == param and words in str(refused.value)


def _messages(**fields: Any) -> list[ChatMessage]:
    return [ChatMessage.model_validate({"content": "hi", **fields})]


def test_a_name_the_template_does_not_write_opens_the_text() -> None:
    for role in ("user", "assistant", "system", "developer"):
        (item,) = template_messages(_messages(role=role, name="alice"), frozenset())
        assert item["content"] == "alice: hi" and item["name"] == "alice"
    # Written by the template, or unknown (a client's own template): as it came.
    assert template_messages(_messages(role="user", name="alice"), {"user"})[0]["content"] == "hi"
    assert template_messages(_messages(role="user", name="alice"))[0]["content"] == "hi"
    # A tool's name is its function's, and a message without text has nothing to attribute.
    tool = template_messages(_messages(role="tool", name="get_weather", tool_call_id="c1"), frozenset())
    assert tool[0]["content"] == "hi"
    calls_only = ChatMessage.model_validate({"role": "assistant", "name": "bot", "content": None, "tool_calls": [
        {"id": "c1", "function": {"name": "get_weather", "arguments": "{}"}}]})
    assert template_messages([calls_only], frozenset())[0]["content"] == ""


class Jinja:
    """A tokenizer that renders its chat template with jinja, as transformers does."""

    has_chat_template = True

    def __init__(self, template: str) -> None:
        self.chat_template = template

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        env = ImmutableSandboxedEnvironment()
        env.globals["raise_exception"] = lambda text: (_ for _ in ()).throw(ValueError(text))
        return env.from_string(self.chat_template).render(messages=messages, **kwargs)


@pytest.mark.parametrize("template, roles", [
    # Kimi's header: the speaker's name in place of the role.
    ("{% for m in messages %}{{ m.get('name') or m.role }}: {{ m.content }}\n{% endfor %}",
     {"user", "assistant", "system"}),
    ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}", set()),
    # Gemma 4 reads `name` for tool results only.
    ("{% for m in messages %}{% if m.role == 'tool' %}{{ m.name }}{% endif %}{{ m.content }}{% endfor %}", set()),
    ("{% if messages[0].role == 'system' %}{{ raise_exception('no system') }}{% endif %}"
     "{% for m in messages %}[{{ m.name }}] {{ m.content }}{% endfor %}", {"user", "assistant"}),
])
def test_named_roles_are_the_ones_the_template_writes(template: str, roles: set[str]) -> None:
    assert named_roles(Jinja(template)) == roles
    assert named_roles(NoTemplate()) == frozenset()


def _call_text(arguments: Any) -> str:
    message = {"role": "assistant", "content": None,
               "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": arguments}}]}
    return calls_as_text([message])[0]["content"]


@pytest.mark.parametrize("arguments", ['{"path": "README.md"}', {"path": "README.md"}])
def test_a_past_call_is_written_with_its_arguments_as_an_object(arguments: Any) -> None:
    # As the tool prompt asks the model to write it: `"arguments": <arguments-json-object>`, not a JSON string.
    assert _call_text(arguments) == '<tool_call>\n{"name": "read", "arguments": {"path": "README.md"}}\n</tool_call>'


def test_a_past_call_whose_arguments_are_not_json_keeps_them_as_a_string() -> None:
    assert _call_text("{not json") == '<tool_call>\n{"name": "read", "arguments": "{not json"}\n</tool_call>'
