"""A Mistral-style template refuses tool-call ids other than nine alphanumerics: the ids this server issues (and
OpenAI's) are mapped onto such ids, the same way every turn, so an agent's second turn renders (it was a 400)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.chat.call_ids import nine_char_id, wants_nine_char_ids, with_nine_char_ids
from tests.fixtures.tiny_llm import build_tiny_llm
from tests.service.fake_engine import rendered_prompt

# Mistral's rule, in a template of our own (its ids are written into the prompt, as Mistral's are).
STRICT = (
    "{%- if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.tool_calls %}{%- for c in m.tool_calls %}"
    "{%- if c.id|length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
    "{%- endif %}[TOOL_CALLS]{{ c.id }}{{ c.function.name }}{%- endfor %}"
    "{%- elif m.role == 'tool' %}"
    "{%- if m.tool_call_id|length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings with "
    "length 9!') }}{%- endif %}[TOOL_RESULTS]{{ m.tool_call_id }} {{ m.content }}"
    "{%- else %}<{{ m.role }}>{{ m.content }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<assistant>{%- endif %}"
)


def test_ids_map_to_nine_alphanumerics_the_same_way_each_time() -> None:
    ids = ["call_0b0e5463bb4f4a57bb2f825d", "call_1", "x" * 200, "caf\u00e9-42"]
    mapped = [nine_char_id(i) for i in ids]
    assert all(len(m) == 9 and m.isascii() and m.isalnum() for m in mapped)
    assert len(set(mapped)) == len(ids) and mapped == [nine_char_id(i) for i in ids]
    assert nine_char_id("abcDEF123") == "abcDEF123"  # already Mistral's shape: kept
    messages = [{"role": "assistant", "content": "", "tool_calls": [{"id": ids[0], "function": {"name": "f"}}]},
                {"role": "tool", "tool_call_id": ids[0], "content": "42"}]
    rewritten = with_nine_char_ids(messages)
    assert rewritten[0]["tool_calls"][0]["id"] == rewritten[1]["tool_call_id"] == mapped[0]
    assert messages[1]["tool_call_id"] == ids[0]  # the request's own messages are not changed
    assert wants_nine_char_ids([STRICT])
    assert not wants_nine_char_ids(["{{ messages }}"]) and not wants_nine_char_ids(None)


@pytest.fixture(scope="module")
def strict_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engine.models import load_tokenizer

    return load_tokenizer(build_tiny_llm(Path(tmp_path_factory.mktemp("strict")), chat_template=STRICT))


def test_an_agents_second_turn_renders(strict_tokenizer: Any) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0b0e5463bb4f4a57bb2f825d", "type": "function",
             "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_0b0e5463bb4f4a57bb2f825d", "content": "sunny"},
    ]
    prompt = rendered_prompt(strict_tokenizer, {"messages": messages, "tools": tools})
    short = nine_char_id("call_0b0e5463bb4f4a57bb2f825d")
    assert f"[TOOL_CALLS]{short}get_weather" in prompt and f"[TOOL_RESULTS]{short} sunny" in prompt
