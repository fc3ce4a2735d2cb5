"""vLLM's sampling fields beyond OpenAI's (its SamplingParams), as its clients send them by default: SillyTavern's
"vLLM" text completion type sends `min_tokens: 0`, `ignore_eos: false` and `spaces_between_special_tokens: true` with
every request. The fields are service/chat/schemas.py SamplingFields'; the engine honours min_tokens and ignore_eos
(engine/sampling.py holds the end tokens back, engine/stop_matcher.py decides the end). vLLM's `top_k: -1` (no
top-k) is taken too.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationInfo

__all__ = ["min_tokens_within_max", "no_top_k"]


def min_tokens_within_max(cls: Any, value: int | None, info: ValidationInfo) -> int | None:
    """A `min_tokens` validator (declared after max_tokens and max_completion_tokens): at most the reply's limit, as
    vLLM refuses more. That limit is the smaller given, else the body's `DEFAULT_MAX_TOKENS` (a text completion's 16);
    without either, the context's room, which the engine fits min_tokens within. Raises ValueError."""
    given = min((v for v in (info.data.get("max_completion_tokens"), info.data.get("max_tokens")) if v is not None),
                default=None)
    limit = given if given is not None else getattr(cls, "DEFAULT_MAX_TOKENS", None)
    if value and limit is not None and value > limit:
        default = "" if given is not None else ", the default"
        raise ValueError(f"must be at most max_tokens ({limit}{default}), as vLLM requires: the reply ends there")
    return value


def no_top_k(cls: Any, value: int | None) -> int | None:
    """A `top_k` validator (the field takes -1 and up): vLLM's and SGLang's -1, which older vLLM recipes send, is no
    top-k, this server's 0. Raises nothing."""
    return 0 if value == -1 else value
