"""Prompts for serving load: distinct random words, lengths set in tokens of the model's own tokenizer.

Each request gets its own system message that starts with random words and its index, so no two prompts
share more than the chat template's first few tokens and no server can reuse another request's prefix.
Words are whole-word vocabulary entries (one token each with a leading space), so word count ≈ token
count; the length is then calibrated by encoding, less the tokens the chat template adds (measured once
with transformers when it can apply the template). usage.prompt_tokens, reported per scenario, is the
exact figure.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Callable

__all__ = ["PromptMaker", "load_token_counter", "template_overhead"]

_WORD = re.compile(r"^(?:Ġ|▁)([a-z]{3,10})$")
_INSTRUCTION = "Continue the following story at great length, in detail, and never stop early:"
# The chat template's own tokens per request (role headers) when the template cannot be applied here.
_TEMPLATE_TOKENS = 10


def load_token_counter(tokenizer_dir: str | Path | None) -> tuple[Callable[[str], int] | None, list[str]]:
    """(tokens_of(text), vocabulary words) from DIR/tokenizer.json via `tokenizers`; (None, []) without one.

    Raises nothing: a missing or unreadable tokenizer falls back to estimates (the caller says so).
    """
    if tokenizer_dir is None or not (Path(tokenizer_dir) / "tokenizer.json").is_file():
        return None, []
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    except Exception:
        return None, []
    words = sorted({m.group(1) for k in tok.get_vocab() if (m := _WORD.match(k))})

    def tokens_of(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    return tokens_of, words


def template_overhead(tokenizer_dir: str | Path | None, tokens_of: Callable[[str], int] | None) -> int:
    """Tokens the model's chat template adds to a system + user pair (transformers applies it); a typical
    figure when it cannot be applied. Raises nothing."""
    if tokenizer_dir is None or tokens_of is None:
        return _TEMPLATE_TOKENS
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        ids = tok.apply_chat_template([{"role": "system", "content": "alpha"}, {"role": "user", "content": "beta"}],
                                      add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
            ids = ids["input_ids"]
        return max(0, len(ids) - tokens_of("alpha") - tokens_of("beta"))
    except Exception:  # no transformers, no template: the typical figure
        return _TEMPLATE_TOKENS


def _pseudo_words(rng: random.Random, n: int = 4000) -> list[str]:
    onsets, vowels, codas = "b c d f g h k l m n p r s t v w".split(), "a e i o u".split(), ["", "n", "r", "s", "t"]
    return sorted({"".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(2)) for _ in range(n)})


class PromptMaker:
    """Deterministic (seeded) distinct prompts of an asked token length."""

    def __init__(self, tokenizer_dir: str | Path | None, seed: int = 0) -> None:
        self.tokens_of, words = load_token_counter(tokenizer_dir)
        self.calibrated = self.tokens_of is not None
        self.template_tokens = template_overhead(tokenizer_dir, self.tokens_of)
        self._seed = seed
        self._words = words or _pseudo_words(random.Random(seed))

    def _count(self, text: str) -> int:
        # Without a tokenizer: ~1.3 tokens per word is typical for English BPE vocabularies.
        return self.tokens_of(text) if self.tokens_of else round(len(text.split()) * 1.3)

    def make(self, index: int, tokens: int, tag: str = "") -> tuple[str, str]:
        """(system, user) for request `index` of about `tokens` prompt tokens. Raises nothing."""
        rng = random.Random(f"{self._seed}/{tag}/{index}")
        head = " ".join(rng.choice(self._words) for _ in range(3))
        system = f"{head.capitalize()} {index}{tag}. You are a storyteller who writes very long answers."
        fixed = self._count(system) + self._count(_INSTRUCTION) + self.template_tokens
        want = max(4, tokens - fixed)
        pool = [rng.choice(self._words) for _ in range(want * 2 + 16)]
        n = want
        for _ in range(6):  # secant steps on words → tokens; converges in 2–3 for whole-word vocabularies
            got = self._count(" " + " ".join(pool[:n]))
            if got == want:
                break
            n = max(1, min(len(pool), round(n * want / max(got, 1))))
        return system, f"{_INSTRUCTION} {' '.join(pool[:n])}"

    def describe(self) -> dict[str, object]:
        """What the lengths are based on (for the JSON result). Raises nothing."""
        return {"calibrated_with_tokenizer": self.calibrated, "template_tokens": self.template_tokens,
                "words": len(self._words), "seed": self._seed}

