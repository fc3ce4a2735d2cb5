"""POST /v1/completions body: OpenAI's legacy text completion, its sampling fields shared with chat's."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from service.chat.schemas import SamplingFields

__all__ = ["CompletionRequest"]


class CompletionRequest(SamplingFields):
    """POST /v1/completions body: one prompt, as text or token ids."""

    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        ..., description="A string, a list of one string, token ids, or a list of one list of token ids.")
    echo: bool | None = Field(False, description="null: false.")
    best_of: int | None = Field(None, description="Only 1 (one completion is generated per request).")
    suffix: str | None = Field(None, description="Only empty: the model writes no text to fit before a suffix.")
    logprobs: int | None = Field(None, ge=0, le=5, description="The sampled token's log probability and this many "
                                                              "of the likeliest, per token.")

    @field_validator("logprobs", mode="before")
    @classmethod
    def _a_count(cls, value: Any) -> Any:
        # Chat's `logprobs: true` (and mlx_lm.server's for completions) got only "Input should be a valid integer".
        if isinstance(value, bool):
            raise ValueError("on /v1/completions logprobs is a count, 0 to 5 (OpenAI's legacy field): how many of "
                             "the likeliest tokens to give beside the sampled one")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, suffix: str | None) -> str | None:
        if suffix:
            raise ValueError("insertion before a suffix is not supported: only an empty suffix is")
        return suffix

    @field_validator("best_of")
    @classmethod
    def _one_candidate(cls, best_of: int | None) -> int | None:
        if best_of not in (1, None):
            raise ValueError("only best_of=1 is supported")
        return best_of

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> str | list[str] | list[int]:
        if isinstance(prompt, list):
            if not prompt:
                raise ValueError("prompt must not be empty")
            if isinstance(prompt[0], (str, list)) and len(prompt) != 1:
                raise ValueError("only one prompt per request is supported")
            if isinstance(prompt[0], list):  # a batch of one token list: that list
                prompt = prompt[0]
                if not prompt:
                    raise ValueError("prompt must not be empty")
            if isinstance(prompt[0], int) and any(t < 0 for t in prompt):
                raise ValueError("token ids must be non-negative")
        return prompt
