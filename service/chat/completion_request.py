"""POST /v1/completions body: OpenAI's legacy text completion, its sampling fields shared with chat's."""

from __future__ import annotations

from typing import Any, ClassVar, cast

from pydantic import Field, ValidationInfo, field_validator

from service.chat.json_output import check_response_format
from service.chat.request_limits import MAX_CHOICES
from service.chat.schemas import SamplingFields
from service.chat.structured_outputs import StructuredOutputFields

__all__ = ["CompletionRequest"]

MAX_LOGPROBS = 20  # as chat's top_logprobs


class CompletionRequest(StructuredOutputFields, SamplingFields):
    """POST /v1/completions body: prompts as text or token ids, `n` choices of each (vLLM's structured outputs after
    the sampling fields)."""

    DEFAULT_MAX_TOKENS: ClassVar[int] = 16  # OpenAI's (and vLLM's) for a completion that names none
    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        ..., description=f"A string, token ids, or a list of either (at most {MAX_CHOICES} choices in all, with n): "
                         "each prompt is completed side by side, its choices indexed in order.")
    n: int | None = Field(1, description=f"Choices of each prompt (null: 1; prompts times n at most {MAX_CHOICES}); "
                                         "a seed gives sample j the seed + j.")
    max_tokens: int | None = Field(None, ge=0, description="0 only with echo: the prompt scored, no reply (OpenAI's "
                                                         "scoring idiom; its log probabilities with logprobs).")
    max_completion_tokens: int | None = Field(None, ge=0, description="The newer name of max_tokens; beside "
                                                                    "it, the reply stops at the smaller.")
    # Before echo, whose check reads it.
    suffix: str | None = Field(None, description="The text after the cursor, for a code model with fill-in-the-middle "
                                                 "tokens (Qwen2.5-Coder, CodeGemma, StarCoder, DeepSeek-Coder, "
                                                 "CodeLlama, Codestral): the reply is the text between prompt and "
                                                 "suffix. Text prompts only, not with echo.")
    echo: bool | None = Field(False, validate_default=True, description="null: false.")
    response_format: dict[str, Any] | None = Field(
        None, description='vLLM\'s: {"type": "json_object"}, {"type": "json_schema", "json_schema": {"name", "schema", '
                          '"strict"}} (or TGI\'s json / regex): the reply follows it from its first token; not beside '
                          'structured_outputs. {"type": "text"}: free text.')
    best_of: int | None = Field(None, description="Only 1 (one completion is generated per request).")
    # vLLM's bound (OpenAI's is 5): SillyTavern's "Request token probabilities" sends 10.
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS, description="The sampled token's log probability and "
                                                                         "this many of the likeliest, per token.")

    @field_validator("response_format", mode="before")
    @classmethod
    def _format(cls, value: Any) -> Any:
        return check_response_format(value)

    @field_validator("logprobs", mode="before")
    @classmethod
    def _a_count(cls, value: Any) -> Any:
        # Chat's `logprobs: true` (and mlx_lm.server's for completions) got only "Input should be a valid integer".
        if isinstance(value, bool):
            raise ValueError(f"on /v1/completions logprobs is a count, 0 to {MAX_LOGPROBS} (OpenAI's legacy field): "
                             "how many of the likeliest tokens to give beside the sampled one")
        return value

    @field_validator("echo")
    @classmethod
    def _scoring_echoes(cls, echo: bool | None, info: ValidationInfo) -> bool | None:
        if not echo and 0 in (info.data.get("max_tokens"), info.data.get("max_completion_tokens")):
            raise ValueError("max_tokens 0 (no reply) is only for scoring a prompt: send echo: true with it")
        if echo and info.data.get("suffix"):  # the reply is no continuation of the prompt to echo it before
            raise ValueError("echo is not supported with a suffix: the reply is the text between prompt and suffix")
        return echo

    @field_validator("best_of")
    @classmethod
    def _one_candidate(cls, best_of: int | None) -> int | None:
        if best_of not in (1, None):
            raise ValueError("only best_of=1 is supported")
        return best_of

    # Prompts times n past MAX_CHOICES is the route's to refuse (service/chat/choices.py check_capacity): it names n.
    @field_validator("prompt")
    @classmethod
    def _prompts(cls, prompt: Any) -> str | list[str] | list[int] | list[list[int]]:
        if isinstance(prompt, list):
            if not prompt:
                raise ValueError("prompt must not be empty")
            if len(prompt) > MAX_CHOICES and isinstance(prompt[0], (str, list)):
                raise ValueError(f"at most {MAX_CHOICES} prompts in one request")
            for item in prompt if isinstance(prompt[0], (str, list)) else [prompt]:
                if isinstance(item, list) and not item:
                    raise ValueError("prompt must not be empty")
                if isinstance(item, list) and any(t < 0 for t in item):
                    raise ValueError("token ids must be non-negative")
        return prompt

    def prompt_items(self) -> list[str | list[int]]:
        """The prompts, each a text or token ids. Raises nothing."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and isinstance(prompt[0], int):
            return [prompt]
        return list(cast(list[str | list[int]], prompt))
