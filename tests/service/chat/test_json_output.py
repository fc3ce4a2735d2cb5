"""service/chat/json_output.py: which grammar a response_format asks for, and from where in the reply it applies —
after the thinking block a reply opens in, after harmony's final-channel header, else from the first token."""

from __future__ import annotations

from typing import Any

import pytest

from service.chat.json_output import output_grammar
from service.http.errors import APIError

pytestmark = pytest.mark.anyio

SCHEMA = {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object", "properties": {
    "ok": {"type": "boolean"}}, "required": ["ok"]}}}


class _Tokenizer:
    """Encodes each marker as one id, as families whose markers are special tokens do."""

    def __init__(self, vocab: dict[str, int], think_end: str | None = None) -> None:
        self._vocab, self.think_end = vocab, think_end

    def get_vocab(self) -> dict[str, int]:
        return self._vocab

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids, rest = [], text
        while rest:
            marker = next(m for m in self._vocab if rest.startswith(m))
            ids.append(self._vocab[marker])
            rest = rest[len(marker):]
        return ids


async def _grammar(tokenizer: Any, response_format: Any, **kw: Any) -> tuple[str | None, tuple[int, ...]]:
    return await output_grammar(response_format, tokenizer=tokenizer, param="response_format",
                                **{"opens_thinking": False, "calls": False, **kw})


async def test_the_grammar_applies_after_a_thinking_block_the_reply_opens_in() -> None:
    thinker = _Tokenizer({"<think>": 5, "</think>": 6}, think_end="</think>")
    grammar, after = await _grammar(thinker, SCHEMA, opens_thinking=True)
    assert grammar is not None and '"ok"' in grammar and after == (6,)
    assert (await _grammar(thinker, SCHEMA))[1] == ()  # thinking switched off: from the first token


async def test_a_harmony_reply_is_constrained_in_its_final_channel() -> None:
    harmony = _Tokenizer({"<|start|>": 1, "<|end|>": 2, "<|message|>": 3, "<|channel|>": 4, "final": 9})
    assert (await _grammar(harmony, {"type": "json_object"}))[1] == (4, 9, 3)


async def test_text_asks_for_nothing_and_tools_the_model_may_call_are_refused() -> None:
    plain = _Tokenizer({"a": 1})
    assert await _grammar(plain, None) == (None, ())
    assert await _grammar(plain, {"type": "text"}) == (None, ())
    with pytest.raises(APIError) as caught:
        await _grammar(plain, SCHEMA, calls=True)
    assert caught.value.status == 400 and caught.value.param == "response_format"
    with pytest.raises(APIError, match="Unknown format"):
        await _grammar(plain, {"type": "json_schema", "json_schema": {"name": "x", "schema": {"format": "nope",
                                                                                             "type": "string"}}})
