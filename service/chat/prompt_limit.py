"""A prompt too long for one request: longer than the model's context, or than what `--memory-budget` holds for one
request (the engine's max_model_len) where that is less. Refused in the words agents look for to compact their
conversation (opencode's and pi's overflow patterns: "maximum context length is N tokens"; Claude Code's, on
/v1/messages: Anthropic's "prompt is too long: N tokens > M maximum"), always naming the lower limit."""

from __future__ import annotations

from service.http.errors import APIError
from service.seams import ChatEngine

__all__ = ["PromptTooLong", "check_prompt_fits", "usable_context"]


class PromptTooLong(APIError):
    """400 for a prompt of `tokens` that leaves no room to generate within `limit` tokens (the model's `context` or
    less): context_length_exceeded past the model's context, else the memory budget's memory_admission /
    context_over_budget. `chars`: text refused before it was tokenized, `tokens` the fewest it can make.
    `anthropic_message` is Anthropic's wording of it."""

    def __init__(self, tokens: int, limit: int, context: int, param: str, *, chars: int | None = None) -> None:
        budget = limit < context
        under = f" under this server's memory budget (the model's own is {context})" if budget else ""
        detail = f", but the prompt has {tokens} tokens." if chars is None else \
            f"; there are {chars} characters in the {param}, more than any {context} tokens can hold."
        message = f"This model's maximum context length is {limit} tokens{under}{detail}"
        if tokens >= context:
            super().__init__(400, message, param=param, code="context_length_exceeded")
        else:
            super().__init__(400, message, type="memory_admission", param=param, code="context_over_budget")
        # The longest prompt that fits leaves one position for the reply: Anthropic's "maximum" is that prompt's.
        notes = ([f"the fewest its {chars} characters make"] if chars is not None else []) + \
            ([f"this server's memory budget; the model's context is {context} tokens"] if budget else [])
        self.anthropic_message = f"prompt is too long: {tokens} tokens > {limit - 1} maximum" + (
            f" ({'; '.join(notes)})" if notes else "")


def usable_context(engine: ChatEngine) -> int | None:
    """The most tokens one request may have: the model's context, or less where the memory budget holds less (the
    engine's max_model_len); None when the context is unknown. Raises nothing."""
    context = engine.context_length
    if not isinstance(context, int) or context <= 0:
        return None
    usable = getattr(engine, "max_model_len", None)  # stand-ins for the engine may not say
    return min(context, usable) if isinstance(usable, int) and usable > 0 else context


def check_prompt_fits(engine: ChatEngine, tokens: int, param: str) -> None:
    """Raises PromptTooLong when a prompt of `tokens` leaves no room to generate within usable_context. Nothing
    without a known context."""
    limit = usable_context(engine)
    if limit is not None and tokens >= limit:
        raise PromptTooLong(tokens, limit, engine.context_length or limit, param)
