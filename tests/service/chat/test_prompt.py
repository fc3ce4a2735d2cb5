"""service/chat/prompt.py: where the tool block goes for a template that does not take tools, and the plain
rendering without a template."""

from __future__ import annotations

from service.chat.prompt import render_text, takes_tools, with_tool_prompt

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


def test_without_a_template_tools_are_not_dropped() -> None:
    assert not takes_tools(NoTemplate(), None)
    text, special = render_text(NoTemplate(), [USER], TOOLS)
    assert special and text.startswith("system: # Tools") and '"get_weather"' in text
    assert text.endswith("user: weather?\nassistant: ")
