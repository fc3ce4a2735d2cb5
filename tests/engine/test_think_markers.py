"""Mistral's reasoning models think between `[THINK]` and `[/THINK]`: their thinking goes to reasoning_content
(it reached content before), and the markers stay in the text for the splitter."""

from __future__ import annotations

from pathlib import Path

from engine.chat_output import OutputMarkers
from engine.special_tokens import hidden_special_ids
from engine.think_markers import fallback_think_markers
from tests.fixtures.tiny_llm import build_tiny_llm


def test_bracket_think_markers_split_the_reply(tmp_path: Path) -> None:
    from engine.models import load_tokenizer
    from service.chat.output import ChatTranslator

    tokenizer = load_tokenizer(build_tiny_llm(tmp_path / "m", extra_special_tokens=("[THINK]", "[/THINK]")))
    assert getattr(tokenizer, "think_start", None) is None  # mlx-lm knows only <think>-style pairs
    markers = OutputMarkers.from_tokenizer(tokenizer)
    assert (markers.think_start, markers.think_end) == ("[THINK]", "[/THINK]")
    vocab = tokenizer.get_vocab()
    assert not {vocab["[THINK]"], vocab["[/THINK]"]} & hidden_special_ids(tokenizer)
    translator = ChatTranslator.for_request(tokenizer, [])
    for piece in ("[THI", "NK]The user greets.", "[/THINK]", "Hello!"):
        translator.feed(piece)
    translator.finish()
    message = translator.message()
    assert (message.reasoning_content, message.content) == ("The user greets.", "Hello!")


def test_other_vocabularies_have_none(tmp_path: Path) -> None:
    from engine.models import load_tokenizer

    assert fallback_think_markers(load_tokenizer(build_tiny_llm(tmp_path / "plain"))) is None
