"""A template that indexes into a message's content parts (early Gemma 3's `messages[0]['content'][0]['text']`)
gets each message's text as one part: every conversation with a system message was a 400 before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.chat.content_parts import as_text_parts, reads_text_parts
from tests.fixtures.tiny_llm import CHATML_TEMPLATE, build_tiny_llm
from tests.service.fake_engine import rendered_prompt

# Our own template in that shape: the system text read from its first part, the rest as string or parts.
PARTS = (
    "{%- if messages[0]['role'] == 'system' -%}{%- set prefix = messages[0]['content'][0]['text'] + ' ' -%}"
    "{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set prefix = '' -%}{%- set loop_messages = messages -%}"
    "{%- endif -%}{%- for m in loop_messages -%}<{{ m['role'] }}>{{ prefix if loop.first else '' }}"
    "{%- if m['content'] is string -%}{{ m['content'] }}{%- else -%}{%- for p in m['content'] -%}{{ p['text'] }}"
    "{%- endfor -%}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}<assistant>{%- endif -%}"
)


def test_which_templates_index_into_parts() -> None:
    assert reads_text_parts([PARTS]) and reads_text_parts(["{{ message.content[0].text }}"])
    assert not reads_text_parts([CHATML_TEMPLATE]) and not reads_text_parts(None)
    assert as_text_parts([{"role": "user", "content": "hi"}]) == [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}]


@pytest.fixture(scope="module")
def parts_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engine.models import load_tokenizer

    return load_tokenizer(build_tiny_llm(Path(tmp_path_factory.mktemp("parts")), chat_template=PARTS))


def test_a_system_message_renders(parts_tokenizer: Any) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert rendered_prompt(parts_tokenizer, {"messages": messages}).endswith("<user>Be brief. hi<assistant>")


# Our own template in Mistral's reasoning shape: an assistant's earlier thinking read from `thinking` chunks only.
THINKING_CHUNKS = (
    "{%- for m in messages -%}{%- if m['role'] == 'assistant' -%}"
    "{%- if m['content'] is string -%}{{ m['content'] }}{%- else -%}{%- for block in m['content'] -%}"
    "{%- if block['type'] == 'thinking' -%}[THINK]{{ block['thinking'] }}[/THINK]"
    "{%- elif block['type'] == 'text' -%}{{ block['text'] }}{%- endif -%}{%- endfor -%}{%- endif -%}</s>"
    "{%- else -%}[INST]{{ m['content'] }}[/INST]{%- endif -%}{%- endfor -%}"
)


def test_earlier_reasoning_reaches_a_template_that_reads_thinking_chunks(tmp_path: Path) -> None:
    # Magistral's and Ministral 3 Reasoning's templates: `reasoning_content` sent back was silently dropped.
    from engine.models import load_tokenizer

    tokenizer = load_tokenizer(build_tiny_llm(tmp_path / "m", chat_template=THINKING_CHUNKS))
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet back."},
                {"role": "user", "content": "bye"}]
    prompt = rendered_prompt(tokenizer, {"messages": messages})
    assert "[INST]hi[/INST][THINK]Greet back.[/THINK]Hello.</s>[INST]bye[/INST]" in prompt
