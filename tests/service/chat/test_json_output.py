"""service/chat/json_output.py: which grammar a response_format asks for, and from where in the reply it applies —
after the thinking block a reply opens in, after harmony's final-channel header, else from the first token."""

from __future__ import annotations

from typing import Any

import pytest

from engine.contracts import GrammarSpec
from service.chat.json_output import output_grammar
from service.http.errors import APIError

pytestmark = pytest.mark.anyio

SCHEMA = {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object", "properties": {
    "ok": {"type": "boolean"}}, "required": ["ok"]}}}


class _Tokenizer:
    """Encodes each marker as one id, as families whose markers are special tokens do."""

    def __init__(self, vocab: dict[str, int], think_end: str | None = None, call_start: str | None = None) -> None:
        self._vocab, self.think_end = vocab, think_end
        if call_start is not None:  # mlx-lm's wrapper names a family's call markers beside its parser
            self.tool_parser, self.tool_call_start, self.tool_call_end = (lambda text, tools: {}), call_start, ""

    def get_vocab(self) -> dict[str, int]:
        return self._vocab

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids, rest = [], text
        while rest:
            marker = next(m for m in self._vocab if rest.startswith(m))
            ids.append(self._vocab[marker])
            rest = rest[len(marker):]
        return ids


async def _grammar(tokenizer: Any, response_format: Any, **kw: Any) -> GrammarSpec | None:
    return await output_grammar(response_format, tokenizer=tokenizer, param="response_format",
                                **{"opens_thinking": False, "calls": False, **kw})


async def test_the_grammar_applies_after_a_thinking_block_the_reply_opens_in() -> None:
    thinker = _Tokenizer({"<think>": 5, "</think>": 6}, think_end="</think>")
    grammar = await _grammar(thinker, SCHEMA, opens_thinking=True)
    assert grammar is not None and '"ok"' in grammar.text and grammar.after == (6,) and grammar.escape is None
    off = await _grammar(thinker, SCHEMA)  # thinking switched off: from the first token
    assert off is not None and off.after == ()


async def test_a_harmony_reply_is_constrained_in_its_final_channel() -> None:
    harmony = _Tokenizer({"<|start|>": 1, "<|end|>": 2, "<|message|>": 3, "<|channel|>": 4, "final": 9})
    grammar = await _grammar(harmony, {"type": "json_object"}, calls=True)  # its calls go to another channel
    assert grammar is not None and grammar.after == (4, 9, 3) and grammar.escape is None


async def test_beside_tools_a_one_token_call_marker_may_open_the_reply() -> None:
    qwen = _Tokenizer({"<tool_call>": 7, "<": 1, "tool": 2, "_call": 3, ">": 4}, call_start="<tool_call>")
    grammar = await _grammar(qwen, SCHEMA, calls=True)
    assert grammar is not None and grammar.escape == 7
    # Told of its tools in our words, a model without the special token writes "<tool_call>" in four tokens.
    plain = _Tokenizer({"<": 1, "tool": 2, "_call": 3, ">": 4})
    with pytest.raises(APIError) as caught:
        await _grammar(plain, SCHEMA, calls=True, json_calls=True)
    assert caught.value.status == 400 and caught.value.param == "response_format"


async def test_text_asks_for_nothing_and_an_unenforceable_schema_is_refused() -> None:
    plain = _Tokenizer({"a": 1})
    assert await _grammar(plain, None) is None
    assert await _grammar(plain, {"type": "text"}) is None
    with pytest.raises(APIError, match="Unknown format"):
        await _grammar(plain, {"type": "json_schema", "json_schema": {"name": "x", "schema": {"format": "nope",
                                                                                             "type": "string"}}})
