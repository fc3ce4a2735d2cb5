"""Special tokens a reply's text leaves out, as transformers' `decode(skip_special_tokens=True)` and vLLM do.

A model may write a special token mid-reply (SmolLM2's `<|endoftext|>` when its eos is `<|im_end|>`, a stray
`<|im_start|>`): its text is markup, not content. The tokens a reply's markers are made of (think and tool-call
tags the output splitter reads, engine/chat_output.py; harmony's message markers, engine/harmony.py) stay, as do
end-of-sequence ids, which stop the row anyway. A request may keep them all (`skip_special_tokens: false`, vLLM's
field). Special are the tokenizer's named ones (bos, eos, pad, additional) and every added token the tokenizer marks
special (SmolLM2's `<file_sep>`, Llama 3's header and reserved tokens), as transformers skips them; the latter only
where the family has no tool-call format, whose parsers read special tokens inside a call (Mistral's `[ARGS]`,
Kimi's `<|tool_call_begin|>`: vLLM turns skipping off for such requests).
"""

from __future__ import annotations

from typing import Any

from engine.bare_json_calls import PYTHON_TAG
from engine.per_tokenizer import PerTokenizer

__all__ = ["hidden_special_ids"]

# Tags some templates and our tool prompt use whether or not the tokenizer names them (service/chat/prompt.py).
_KEPT_TEXTS = ("<tool_call>", "</tool_call>", "<think>", "</think>", PYTHON_TAG)


def hidden_special_ids(tokenizer: Any) -> frozenset[int]:
    """The special token ids whose text a reply leaves out (computed once per tokenizer). Raises nothing."""
    return _HIDDEN.get(tokenizer)


def _hidden(tokenizer: Any) -> frozenset[int]:
    from engine.chat_output import OutputMarkers
    from engine.harmony import MARKER_TEXTS, is_harmony

    try:
        special = {int(i) for i in getattr(tokenizer, "all_special_ids", None) or ()}
        markers = OutputMarkers.from_tokenizer(tokenizer)
        if markers.tool_call_start is None and not is_harmony(tokenizer):
            special |= _added_special(tokenizer)
        kept_texts = [t for t in (markers.think_start, markers.think_end, markers.tool_call_start,
                                  markers.tool_call_end, *_KEPT_TEXTS) if t]
        if is_harmony(tokenizer):
            kept_texts += MARKER_TEXTS
        stops = set(getattr(tokenizer, "eos_token_ids", None) or ())
        hidden = set()
        for token in special - stops:
            text = tokenizer.convert_ids_to_tokens(token)
            if isinstance(text, str) and text and not any(text in marker for marker in kept_texts):
                hidden.add(token)
        return frozenset(hidden)
    except Exception:  # noqa: BLE001 — a tokenizer without these attributes: nothing is hidden
        return frozenset()


def _added_special(tokenizer: Any) -> set[int]:
    """The ids of the added tokens the tokenizer marks special (tokenizer.json's `"special": true`). Raises nothing."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return {int(i) for i, token in added.items() if getattr(token, "special", False)}


_HIDDEN = PerTokenizer(_hidden)
