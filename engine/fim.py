"""Fill-in-the-middle prompts for code models: the family's FIM tokens found in the tokenizer's vocabulary (never
guessed from the model's name), and a prefix and suffix made into the token ids that family was trained on.

The markers go in as their special tokens' ids; only the client's prefix and suffix are tokenized as text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.per_tokenizer import PerTokenizer

__all__ = ["FimFormat", "fim_format"]

# SentencePiece writes a space before a text's first word; the suffix must not get one (codellama's and
# mistral_common's `_encode_infilling` tokenize "☺" + text and drop the marker's tokens).
_MARKER = "☺"


@dataclass(frozen=True)
class _Family:
    name: str
    prefix: str
    suffix: str
    middle: str | None  # None: the prompt ends with the prefix (Mistral's suffix-first order)
    suffix_first: bool = False
    spaceless_suffix: bool = False
    ends: tuple[str, ...] = ()  # tokens that end the middle besides eos, where the vocabulary has them


_FAMILIES = (
    # Qwen2.5-Coder's README and Continue's qwenCoderFimTemplate; CodeGemma uses the same tokens. The ends are
    # llama.cpp's end-of-generation tokens for FIM (llama-vocab.cpp).
    _Family("qwen", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
            ends=("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<|file_separator|>")),
    # vLLM's fim/__init__.py "starcoder" template (StarCoder, StarCoder2).
    _Family("starcoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", ends=("<|endoftext|>", "<file_sep>")),
    # bigcode/santacoder's model card: the same order with hyphens.
    _Family("santacoder", "<fim-prefix>", "<fim-suffix>", "<fim-middle>", ends=("<|endoftext|>",)),
    # vLLM's fim/__init__.py "deepseek" template (DeepSeek-Coder).
    _Family("deepseek", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", ends=("<｜end▁of▁sentence｜>", "<|EOT|>")),
    # vLLM's CodeLlamaFIMEncoder, from Meta's codellama generation.py: `<s>▁<PRE> {prefix}▁<SUF>{suffix}▁<MID>`.
    _Family("codellama", "▁<PRE>", "▁<SUF>", "▁<MID>", spaceless_suffix=True, ends=("▁<EOT>",)),
    # mistral_common InstructTokenizerV2.encode_fim (Codestral): `<s>[SUFFIX]{suffix}[PREFIX]{prefix}`.
    _Family("mistral", "[PREFIX]", "[SUFFIX]", None, suffix_first=True, spaceless_suffix=True),
)


@dataclass(frozen=True)
class FimFormat:
    """One tokenizer's FIM prompt: its family, the markers' ids, the special ids an ordinary encode puts first
    (a BOS), and the tokens that end the middle besides eos."""

    family: str
    prefix_id: int
    suffix_id: int
    middle_id: int | None
    lead: tuple[int, ...]
    stop_ids: tuple[int, ...]
    suffix_first: bool = False
    spaceless_suffix: bool = False

    def encode(self, tokenizer: Any, prefix: str, suffix: str) -> list[int]:
        """The prompt's token ids for text before (`prefix`) and after (`suffix`) the cursor. Blocking (it
        tokenizes). Raises what the tokenizer raises."""
        before = [self.prefix_id, *_text_ids(tokenizer, prefix)]
        after = [self.suffix_id, *(_spaceless_ids(tokenizer, suffix) if self.spaceless_suffix
                                   else _text_ids(tokenizer, suffix))]
        middle = [self.middle_id] if self.middle_id is not None else []
        return [*self.lead, *(after + before if self.suffix_first else before + after), *middle]


def fim_format(tokenizer: Any) -> FimFormat | None:
    """The tokenizer's FIM format (found once per tokenizer), or None when its vocabulary has no family's FIM
    tokens. Raises nothing."""
    return _FORMATS.get(tokenizer)


def _text_ids(tokenizer: Any, text: str) -> list[int]:
    return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]


def _spaceless_ids(tokenizer: Any, text: str) -> list[int]:
    marked, marker = _text_ids(tokenizer, _MARKER + text), _text_ids(tokenizer, _MARKER)
    # The marker's tokens lead unless it merged with the text's first characters: then the text alone.
    return marked[len(marker):] if marked[:len(marker)] == marker else _text_ids(tokenizer, text)


def _token_id(tokenizer: Any, text: str) -> int | None:
    """The id of the vocabulary entry `text`, or None (an unknown text maps to the unk id, or to id 0)."""
    found = tokenizer.convert_tokens_to_ids(text)
    if not isinstance(found, int) or found < 0:
        return None
    return found if tokenizer.convert_ids_to_tokens(found) == text else None


def _lead(tokenizer: Any) -> tuple[int, ...]:
    """The ids an ordinary encode puts before the text (a BOS where the tokenizer adds one: CodeLlama, Mistral,
    DeepSeek-Coder), as llama.cpp's format_infill and the families' reference encoders start the prompt."""
    full, bare = [int(t) for t in tokenizer.encode("a")], _text_ids(tokenizer, "a")
    at = next((i for i in range(len(full) - len(bare) + 1) if full[i:i + len(bare)] == bare), 0)
    return tuple(full[:at])


def _find(tokenizer: Any) -> FimFormat | None:
    try:
        for family in _FAMILIES:
            prefix, suffix = _token_id(tokenizer, family.prefix), _token_id(tokenizer, family.suffix)
            middle = _token_id(tokenizer, family.middle) if family.middle is not None else None
            if prefix is None or suffix is None or (family.middle is not None and middle is None):
                continue
            stops = tuple(i for i in (_token_id(tokenizer, end) for end in family.ends) if i is not None)
            return FimFormat(family.name, prefix, suffix, middle, _lead(tokenizer), stops,
                             family.suffix_first, family.spaceless_suffix)
    except Exception:  # noqa: BLE001 — a tokenizer that cannot look tokens up has no FIM tokens we can use
        return None
    return None


_FORMATS = PerTokenizer(_find)
