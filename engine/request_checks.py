"""What a generation request must satisfy before it may queue: a prompt of token ids the model knows,
max_tokens >= 1, prompt + max_tokens within the context, valid sampling settings."""

from __future__ import annotations

from engine.contracts import GenerationRequest
from engine.errors import ContextTooLong, InvalidRequest, InvalidSampling
from engine.sampling import MAX_TOP_LOGPROBS, validate_sampling

__all__ = ["check_request"]


def check_request(request: GenerationRequest, *, vocab_size: int, context_length: int) -> list[int]:
    """The request's prompt as ints. Raises InvalidRequest for an empty prompt, token ids outside the
    vocabulary or max_tokens < 1, ContextTooLong when prompt + max_tokens exceeds the context, InvalidSampling
    for invalid sampling settings (engine/errors.py)."""
    prompt = [int(t) for t in request.prompt_tokens]
    if not prompt:
        raise InvalidRequest("the prompt is empty", param="prompt")
    if min(prompt) < 0 or max(prompt) >= vocab_size:
        raise InvalidRequest(f"prompt token ids must be in 0..{vocab_size - 1}", param="prompt")
    if request.max_tokens < 1:
        raise InvalidRequest("max_tokens must be >= 1", param="max_tokens")
    if len(prompt) + request.max_tokens > context_length:
        raise ContextTooLong(
            f"prompt ({len(prompt)} tokens) + max_tokens ({request.max_tokens}) exceeds the context "
            f"length of {context_length} tokens"
        )
    validate_sampling(request.sampling, vocab_size)
    if request.prompt_logprobs is not None and not 0 <= request.prompt_logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidSampling(f"prompt_logprobs must be in [0, {MAX_TOP_LOGPROBS}]", param="prompt_logprobs")
    return prompt
