"""Think markers mlx-lm does not find: Mistral's reasoning models (Magistral, Ministral 3 Reasoning) write their
thinking between `[THINK]` and `[/THINK]`, special tokens mlx-lm's `<think>` detection does not know, so the
thinking reached `content` (or, with special tokens left out, `content` without its markers)."""

from __future__ import annotations

from typing import Any

from engine.per_tokenizer import PerTokenizer

__all__ = ["fallback_think_markers"]

_PAIRS = (("[THINK]", "[/THINK]"),)
def fallback_think_markers(tokenizer: Any) -> tuple[str, str] | None:
    """(start, end) of a think block whose markers are in the tokenizer's vocabulary (found once per tokenizer),
    or None. Raises nothing."""
    return _MARKERS.get(tokenizer)


def _find(tokenizer: Any) -> tuple[str, str] | None:
    try:
        vocab = tokenizer.get_vocab()
        return next(((start, end) for start, end in _PAIRS if start in vocab and end in vocab), None)
    except Exception:  # noqa: BLE001 — a tokenizer that cannot list its vocabulary has no markers we know
        return None


_MARKERS = PerTokenizer(_find)
