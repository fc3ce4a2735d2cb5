"""What a generation request must satisfy before it may queue: a prompt of token ids the model knows,
max_tokens >= 1, prompt + max_tokens within the context, min_tokens and ignore_eos only without a grammar, valid
sampling settings."""

from __future__ import annotations

from engine.contracts import GenerationRequest
from engine.errors import ContextTooLong, InvalidRequest, InvalidSampling
from engine.sampling import MAX_TOP_LOGPROBS, validate_sampling

__all__ = ["check_request"]


def check_request(request: GenerationRequest, *, vocab_size: int, context_length: int) -> list[int]:
    """The request's prompt as ints. Raises InvalidRequest for an empty prompt, token ids outside the
    vocabulary, max_tokens < 1, min_tokens < 0, or min_tokens or ignore_eos beside a grammar, ContextTooLong when
    prompt + max_tokens exceeds the context, InvalidSampling for invalid sampling settings (engine/errors.py)."""
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
    if request.min_tokens < 0:
        raise InvalidRequest("min_tokens must be >= 0", param="min_tokens")
    if request.sampling.grammar is not None:
        # A grammar ends its reply with an end-of-sequence token: held back, a finished reply could take no token.
        for name, asked in (("min_tokens", request.min_tokens > 0), ("ignore_eos", request.ignore_eos)):
            if asked:
                raise InvalidRequest(f"{name} is not supported with a reply that follows a grammar (JSON output, a "
                                     "forced tool call or a strict function): the grammar ends the reply with the "
                                     "end-of-sequence token", param=name)
    validate_sampling(request.sampling, vocab_size)
    if request.prompt_logprobs is not None and not 0 <= request.prompt_logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidSampling(f"prompt_logprobs must be in [0, {MAX_TOP_LOGPROBS}]", param="prompt_logprobs")
    return prompt
