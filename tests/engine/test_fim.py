"""Fill-in-the-middle prompts: each family's FIM tokens found in a real tokenizer's vocabulary and the prompt laid
out as that family was trained, its markers as their special tokens' ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.fim import fim_format
from tests.fixtures.fim_tokenizers import (CODELLAMA_FIM, DEEPSEEK_FIM, MISTRAL_FIM, QWEN_FIM, STARCODER_FIM,
                                           sentencepiece_like, with_added_tokens)

PREFIX, SUFFIX = "def f(a", "):\n    return a"


def _text(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _id(tokenizer: Any, token: str) -> int:
    found = tokenizer.convert_tokens_to_ids(token)
    assert tokenizer.encode(token, add_special_tokens=False) == [found]  # one special token, not text
    return int(found)


@pytest.mark.parametrize("family, tokens, ends", [
    ("qwen", QWEN_FIM, ("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>")),
    ("starcoder", STARCODER_FIM, ("<|endoftext|>", "<file_sep>")),
    ("deepseek", DEEPSEEK_FIM, ()),
])
def test_prefix_suffix_middle_families(tiny_llm_dir: Path, tmp_path: Path, family: str, tokens: tuple[str, ...],
                                       ends: tuple[str, ...]) -> None:
    # `<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>` and its StarCoder and DeepSeek spellings.
    tokenizer = with_added_tokens(tiny_llm_dir, tmp_path, tokens)
    found = fim_format(tokenizer)
    assert found is not None and found.family == family
    pre, suf, mid = (_id(tokenizer, t) for t in tokens[:3])
    assert found.encode(tokenizer, PREFIX, SUFFIX) == [pre, *_text(tokenizer, PREFIX), suf,
                                                      *_text(tokenizer, SUFFIX), mid]
    assert set(found.stop_ids) == {_id(tokenizer, t) for t in ends}
    # the cursor at the file's start: the prefix marker alone
    assert found.encode(tokenizer, "", "x")[:2] == [pre, suf]


def test_codellama_writes_the_suffix_without_sentencepiece_s_leading_space(tmp_path: Path) -> None:
    # `<s>▁<PRE> {prefix}▁<SUF>{suffix}▁<MID>`: the prefix with its `▁`, the suffix without one, ▁<EOT> ends.
    tokenizer = sentencepiece_like(tmp_path, CODELLAMA_FIM)
    found = fim_format(tokenizer)
    assert found is not None and found.family == "codellama"
    pre, suf, mid, eot = (_id(tokenizer, t) for t in CODELLAMA_FIM)
    ids = found.encode(tokenizer, "the fox", "the dog")
    fox = _text(tokenizer, "the fox")
    assert ids[:len(fox) + 3] == [tokenizer.bos_token_id, pre, *fox, suf] and ids[-1] == mid
    assert not tokenizer.convert_ids_to_tokens(ids[len(fox) + 3]).startswith("▁")
    assert tokenizer.decode(ids) == "<s> <PRE> the fox <SUF>the dog <MID>"
    assert found.stop_ids == (eot,)


def test_mistral_puts_the_suffix_first(tmp_path: Path) -> None:
    # mistral_common's encode_fim: `<s>[SUFFIX]{suffix}[PREFIX]{prefix}`, no middle token.
    tokenizer = sentencepiece_like(tmp_path, MISTRAL_FIM)
    found = fim_format(tokenizer)
    assert found is not None and found.family == "mistral"
    prefix, suffix = (_id(tokenizer, t) for t in MISTRAL_FIM)
    ids = found.encode(tokenizer, "the fox", "the dog")
    assert ids[:2] == [tokenizer.bos_token_id, suffix] and ids[-3:] == [prefix, *_text(tokenizer, "the fox")]
    assert tokenizer.decode(ids) == "<s>[SUFFIX]the dog[PREFIX] the fox"


def test_a_vocabulary_without_fim_tokens_has_no_format(tiny_llm_dir: Path, tmp_path: Path) -> None:
    # The demo's case: unknown texts map to id 0 (its `<|endoftext|>`), which is no FIM token.
    assert fim_format(with_added_tokens(tiny_llm_dir, tmp_path, ())) is None
    assert fim_format(object()) is None
