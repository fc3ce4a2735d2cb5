"""XTC sampling ("exclude top choices", as mlx_lm.server offers it): with probability `xtc_probability` a draw drops
every token likelier than `xtc_threshold` but the least likely of them, never the newline or an end-of-text token.
mlx_lm.sample_utils.apply_xtc's mask, its coin drawn with the row's own key when seeded, so seeded rows repeat."""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from engine.per_tokenizer import PerTokenizer

__all__ = ["apply_xtc", "xtc_special_tokens"]


def _special(tokenizer: Any) -> tuple[int, ...]:
    # mlx_lm.server's xtc_special_tokens: what encode("\n") gives (a BOS included, where the tokenizer adds one).
    return tuple(tokenizer.encode("\n")) + tuple(sorted(getattr(tokenizer, "eos_token_ids", None) or ()))


_SPECIAL: PerTokenizer[tuple[int, ...]] = PerTokenizer(_special)


def xtc_special_tokens(tokenizer: Any) -> tuple[int, ...]:
    """The tokens XTC never drops, as mlx_lm.server picks them. Once per tokenizer. Raises what encode raises."""
    return _SPECIAL.get(tokenizer)


def apply_xtc(logprobs: mx.array, probability: float, threshold: float, special: mx.array | None,
              key: mx.array | None) -> mx.array:
    """`logprobs` (rows, vocab) with, if the coin (drawn with `key`, else the global generator) falls below
    `probability`, every token above `threshold` but the least likely of them set to -inf; `special` ids never are.
    Lazy. Raises nothing."""
    probs = mx.softmax(logprobs, -1)
    mask = probs > mx.where(probs > threshold, probs, mx.inf).min(axis=-1, keepdims=True)
    if special is not None:
        mask[..., special] = False
    return mx.where(mx.random.uniform(key=key) > probability, logprobs, mx.where(mask, -mx.inf, logprobs))
