"""gpt-oss's harmony replies split into reasoning (analysis), content (final, preambles) and tool calls (a message
to `functions.NAME`), at every split of the text; a harmony tokenizer keeps its markers and stops at <|call|>."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.harmony import HarmonySplitter, add_harmony_stops, is_harmony
from engine.special_tokens import hidden_special_ids
from tests.fixtures.tiny_llm import build_tiny_llm

OPENING = "<|start|>system<|message|>hi<|end|><|start|>user<|message|>q<|end|><|start|>assistant"
ANSWER = ("<|channel|>analysis<|message|>The user greets. Reply in French.<|end|>"
          "<|start|>assistant<|channel|>final<|message|>Bonjour, le monde !")
CALL = ("<|channel|>analysis<|message|>Need the weather.<|end|>"
        '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
        '{"city": "Paris"}')
# The recipient before the channel, as gpt-oss also writes it; then <|call|> in the text.
CALL_RECIPIENT_FIRST = ('<|start|>assistant to=functions.read<|channel|>commentary json<|message|>{"path": "a.py"}'
                        "<|call|>")
TWO_CALLS = ('<|channel|>commentary to=functions.a <|constrain|>json<|message|>{"x": 1}<|end|>'
             '<|start|>assistant<|channel|>commentary to=functions.b <|constrain|>json<|message|>{}<|end|>')
PREAMBLE = ("<|channel|>commentary<|message|>Let me check that file.<|end|>"
            '<|start|>assistant<|channel|>commentary to=functions.read <|constrain|>json<|message|>{"path": "x"}')
# A preamble after the analysis: two paragraphs of reasoning (content beside a call's thinking is refused by
# gpt-oss's template when the turn comes back).
ANALYSIS_THEN_PREAMBLE = ("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary"
                          "<|message|>Let me look.<|end|><|start|>assistant<|channel|>commentary to=functions.ls"
                          "<|message|>{}")


def run(text: str, pieces: list[str] | None = None, *, cut: bool = False, **kwargs: Any) -> dict[str, Any]:
    splitter = HarmonySplitter(opening=kwargs.pop("opening", OPENING), new_call_id=lambda: "call_1", **kwargs)
    events = []
    for piece in pieces if pieces is not None else [text]:
        events += splitter.feed(piece)
    events += splitter.finish(cut=True) if cut else splitter.finish()
    out: dict[str, Any] = {"content": "", "reasoning": "", "calls": []}
    for event in events:
        if event.kind == "content":
            out["content"] += event.text
        elif event.kind == "reasoning":
            out["reasoning"] += event.text
        elif event.kind == "tool_call_start":
            out["calls"].append([event.name, ""])
        else:
            out["calls"][event.index][1] += event.arguments
    return out


CASES = [
    (ANSWER, {"content": "Bonjour, le monde !", "reasoning": "The user greets. Reply in French.", "calls": []}),
    (CALL, {"content": "", "reasoning": "Need the weather.", "calls": [["get_weather", '{"city": "Paris"}']]}),
    (CALL_RECIPIENT_FIRST, {"content": "", "reasoning": "", "calls": [["read", '{"path": "a.py"}']]}),
    (TWO_CALLS, {"content": "", "reasoning": "", "calls": [["a", '{"x": 1}'], ["b", "{}"]]}),
    (PREAMBLE, {"content": "", "reasoning": "Let me check that file.", "calls": [["read", '{"path": "x"}']]}),
    (ANALYSIS_THEN_PREAMBLE, {"content": "", "reasoning": "Think.\n\nLet me look.", "calls": [["ls", "{}"]]}),
]


@pytest.mark.parametrize("text, expected", CASES)
def test_every_split_gives_the_same_reply(text: str, expected: dict[str, Any]) -> None:
    assert run(text) == expected
    for i in range(1, len(text)):
        assert run(text, [text[:i], text[i:]]) == expected, i
    assert run(text, list(text)) == expected


def test_reasoning_and_content_stream_before_the_reply_ends() -> None:
    splitter = HarmonySplitter(opening=OPENING)
    assert [e.kind for e in splitter.feed("<|channel|>analysis<|message|>Thinking hard")] == ["reasoning"]
    events = splitter.feed("<|end|><|start|>assistant<|channel|>final<|message|>Answer so far")
    assert [(e.kind, getattr(e, "text", "")) for e in events] == [("content", "Answer so far")]


def test_arguments_that_are_not_json_are_content_as_written() -> None:
    out = run('<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"x": ')
    assert out == {"content": '{"x":', "reasoning": "", "calls": []}


@pytest.mark.parametrize("text, expected", [
    ('<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"x": ', {"calls": [["f", '{"x":']]}),
    ("<|channel|>commentary to=functions.f <|constrain|>json<|message|>", {"calls": [["f", ""]]}),
    ("<|channel|>commentary to=functions.f <|constrain|>json", {"calls": [["f", ""]]}),  # cut in its header
    ("<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>fin", {"reasoning": "Hm."}),
    ("<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant", {"reasoning": "Hm."}),
])
def test_a_reply_the_token_limit_cut_keeps_no_header_and_its_call_is_a_call(text: str,
                                                                            expected: dict[str, Any]) -> None:
    # OpenAI's shape of a call max_tokens cut: its arguments as written so far; a header is never content
    assert run(text, cut=True) == {"content": "", "reasoning": "", "calls": [], **expected}


def test_tool_choice_none_makes_a_call_content() -> None:
    assert run(CALL, calls=False) == {"content": '{"city": "Paris"}', "reasoning": "Need the weather.", "calls": []}


def test_a_reply_outside_the_format_is_content_and_streams() -> None:
    splitter = HarmonySplitter(opening=OPENING)
    events = splitter.feed("Plain words from a model\nthat ignores the format")
    assert "".join(e.text for e in events if e.kind == "content") + "".join(
        e.text for e in splitter.finish() if e.kind == "content") == \
        "Plain words from a model\nthat ignores the format"
    assert events, "off-format text must not wait for the end of the reply"


def test_a_channel_the_template_opened_is_the_first_body() -> None:
    out = run("Just the answer.", opening=OPENING + "<|channel|>final<|message|>")
    assert out == {"content": "Just the answer.", "reasoning": "", "calls": []}


MARKERS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")
# A compact template in gpt-oss's shape (system, turns, earlier calls with their `thinking`, `<|start|>assistant`).
HARMONY_TEMPLATE = (
    "{{ '<|start|>system<|message|>Reasoning: ' + (reasoning_effort or 'medium') + '<|end|>' }}"
    "{%- for t in tools or [] %}{{ '<|start|>developer<|message|>// ' + t.function.description + '\\n'"
    " + t.function.name + '<|end|>' }}{%- endfor %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' and m.tool_calls %}"
    "{% if m.thinking %}{{ '<|start|>assistant<|channel|>analysis<|message|>' + m.thinking + '<|end|>' }}{% endif %}"
    "{% for c in m.tool_calls %}{{ '<|start|>assistant to=functions.' + c.function.name"
    " + '<|channel|>commentary json<|message|>' + (c.function.arguments | tojson) + '<|call|>' }}{% endfor %}"
    "{% elif m.role == 'assistant' %}{{ '<|start|>assistant<|channel|>final<|message|>' + m.content + '<|end|>' }}"
    "{% elif m.role == 'tool' %}{{ '<|start|>functions.f to=assistant<|channel|>commentary<|message|>'"
    " + m.content + '<|end|>' }}"
    "{% else %}{{ '<|start|>' + m.role + '<|message|>' + m.content + '<|end|>' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)


def build_harmony_llm(path: Path) -> Path:
    """A tiny checkpoint whose vocabulary has harmony's markers as special tokens (as o200k_harmony does) and a
    template in gpt-oss's shape; its config names only <|return|> as the end of a reply (as some conversions do)."""
    import json

    path = build_tiny_llm(path, extra_special_tokens=MARKERS, chat_template=HARMONY_TEMPLATE)
    config = json.loads((path / "config.json").read_text())
    vocab = json.loads((path / "tokenizer.json").read_text())["model"]["vocab"]
    config["eos_token_id"] = vocab["<|return|>"]
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def harmony_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_harmony_llm(tmp_path_factory.mktemp("harmony"))


def test_a_harmony_tokenizer_keeps_its_markers_and_stops_at_a_call(harmony_dir: Path) -> None:
    from engine.models import load_tokenizer

    tokenizer = load_tokenizer(harmony_dir)
    vocab = tokenizer.get_vocab()
    assert is_harmony(tokenizer)
    assert {vocab["<|return|>"], vocab["<|call|>"]} <= set(tokenizer.eos_token_ids)
    hidden = hidden_special_ids(tokenizer)
    for marker in ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>"):
        assert vocab[marker] not in hidden, marker
    assert vocab["<|endoftext|>"] in hidden  # other special tokens are still left out


def test_other_tokenizers_are_left_alone(tmp_path: Path) -> None:
    from engine.models import load_tokenizer

    tokenizer = load_tokenizer(build_tiny_llm(tmp_path / "plain"))
    before = set(tokenizer.eos_token_ids)
    add_harmony_stops(tokenizer)
    assert not is_harmony(tokenizer) and set(tokenizer.eos_token_ids) == before
