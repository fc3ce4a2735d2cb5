"""The language model's settings of an mlx-lm model: `model.args`, or, where a checkpoint nests them under
`text_config` (Qwen3.5, Gemma 3's multimodal layout), its language model's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

__all__ = ["text_args"]

_WIDTHS = ("hidden_size", "d_model", "n_embd")


def text_args(model: Any) -> Any:
    """The settings that size the language model (hidden size, heads, vocabulary): `model.args` where they say so,
    else its language model's args, else its `text_config` read as attributes; None when the model has no args.
    Raises nothing."""
    args = getattr(model, "args", None)
    if _sized(args):
        return args
    inner = getattr(getattr(model, "language_model", None), "args", None)
    if _sized(inner):
        return inner
    nested = getattr(args, "text_config", None)
    if isinstance(nested, dict) and any(isinstance(nested.get(k), int) for k in _WIDTHS):
        return SimpleNamespace(**nested)
    return args


def _sized(args: Any) -> bool:
    return args is not None and any(isinstance(getattr(args, k, None), int) for k in _WIDTHS)
