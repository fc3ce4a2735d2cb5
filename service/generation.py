"""What chat and text completions share: model lookup, request → GenerationRequest, submission, usage.

Every check that can fail does so here, before response headers go out, so it becomes a plain 4xx.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Sequence

import anyio

from engine.contracts import Delta, GenerationRequest, SamplingParams
from engine.memory import MemoryAdmission
from service.app import AppState
from service.errors import APIError, context_length_exceeded, model_not_found
from service.schemas import PromptTokensDetails, SamplingFields, Usage

__all__ = [
    "row_texts",
    "chat_engine",
    "vocab_size",
    "sampling_params",
    "generation_request",
    "submit",
    "UsageCounter",
    "ResponseMeta",
    "close_stream",
    "stream_failure",
]


def chat_engine(state: AppState, requested: str | None) -> Any:
    """The engine serving `requested` (None or "" = the loaded chat model).

    Raises APIError 404 model_not_found when no chat model with that name is served."""
    name = state.chat_model_name
    available = [card.id for card in state.model_cards()]
    if name is None:
        raise model_not_found(requested or "(default)", available)
    if requested and requested != name and requested not in state.model_aliases:
        raise model_not_found(requested, available)
    return state.engine


def vocab_size(engine: Any) -> int | None:
    """The model's vocabulary size when known. Raises nothing."""
    for owner in (engine, getattr(engine, "group", None)):
        size = getattr(owner, "vocab_size", None)
        if isinstance(size, int):
            return size
    try:
        return len(engine.tokenizer)
    except Exception:  # a tokenizer without __len__: skip the range check
        return None


def sampling_params(body: SamplingFields, vocab: int | None) -> SamplingParams:
    """SamplingParams from the OpenAI fields (None → engine defaults).

    Raises APIError 400 for a logit_bias token id outside the vocabulary."""
    bias: dict[int, float] | None = None
    if body.logit_bias:
        bias = {int(k): float(v) for k, v in body.logit_bias.items()}
        if vocab is not None and (bad := [t for t in bias if t >= vocab]):
            raise APIError(400, f"logit_bias: token id {bad[0]} is outside the vocabulary (size {vocab})", param="logit_bias")
    defaults = SamplingParams()
    return SamplingParams(
        temperature=defaults.temperature if body.temperature is None else body.temperature,
        top_p=defaults.top_p if body.top_p is None else body.top_p,
        top_k=defaults.top_k if body.top_k is None else body.top_k,
        min_p=defaults.min_p if body.min_p is None else body.min_p,
        # OpenAI seeds are any integer; MLX keys take uint64: fold, so every seed is valid and stable.
        seed=None if body.seed is None else body.seed % (1 << 64),
        repetition_penalty=defaults.repetition_penalty if body.repetition_penalty is None else body.repetition_penalty,
        presence_penalty=defaults.presence_penalty if body.presence_penalty is None else body.presence_penalty,
        frequency_penalty=defaults.frequency_penalty if body.frequency_penalty is None else body.frequency_penalty,
        logit_bias=bias,
    )


def generation_request(
    engine: Any,
    body: SamplingFields,
    prompt: list[int],
    max_tokens: int | None,
    *,
    param: str,
    session_id: str | None = None,
    segment_boundaries: Sequence[int] = (),
) -> GenerationRequest:
    """Build the engine request; max_tokens defaults to (and is capped at) what the context has left.

    Raises APIError 400 context_length_exceeded when the prompt leaves no room to generate."""
    context = getattr(engine, "context_length", None)
    if not prompt:
        raise APIError(400, "The prompt is empty after tokenization.", param=param, code="empty_prompt")
    room = max_tokens or 1 << 30
    if isinstance(context, int) and context > 0:
        left = context - len(prompt)
        if left <= 0:
            raise context_length_exceeded(
                f"This model's maximum context length is {context} tokens, but the prompt has {len(prompt)} tokens.",
                param=param,
            )
        room = min(room, left)
    return GenerationRequest(
        prompt_tokens=list(prompt),
        sampling=sampling_params(body, vocab_size(engine)),
        max_tokens=room,
        stop=tuple(body.stop_list()),
        session_id=session_id,
        namespace=getattr(engine, "model_name", "") or "",
        segment_boundaries=tuple(segment_boundaries),
        max_tokens_requested=max_tokens is not None,
    )


def submit(engine: Any, request: GenerationRequest, *, param: str) -> Any:
    """Queue the request; returns the row's delta stream.

    Raises APIError 400 (context_length_exceeded when the prompt does not fit, invalid_request_error for
    settings the engine rejects) and APIError 503 when the engine no longer accepts work (shutting down)."""
    try:
        return engine.submit(request)
    except MemoryAdmission as exc:
        raise APIError(400, str(exc), type="memory_admission", param=param, code=exc.code) from exc
    except ValueError as exc:
        if "context" in str(exc):
            raise context_length_exceeded(str(exc), param=param) from exc
        raise APIError(400, str(exc), code="invalid_value") from exc
    except RuntimeError as exc:
        raise APIError(503, f"The engine is not accepting requests: {exc}", type="server_error") from exc


async def close_stream(stream: Any) -> None:
    """aclose a row stream even from a cancelled scope (frees the row). Raises nothing."""
    with anyio.CancelScope(shield=True):
        try:
            await stream.aclose()
        except Exception:  # closing is best effort; the engine prunes the row either way
            pass


@dataclass
class UsageCounter:
    """Token counts of one reply, from the deltas (the engine's totals win when it reports them)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    _generated: int = 0

    def add(self, delta: Delta) -> None:
        """Raises nothing."""
        self._generated += len(delta.token_ids)
        self.prompt_tokens = max(self.prompt_tokens, delta.prompt_tokens)
        self.completion_tokens = max(self.completion_tokens, delta.completion_tokens)
        self.cached_tokens = max(self.cached_tokens, delta.cached_tokens)

    def usage(self) -> Usage:
        """Raises nothing."""
        completion = self.completion_tokens or self._generated
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=completion,
            total_tokens=self.prompt_tokens + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=self.cached_tokens),
        )


@dataclass
class ResponseMeta:
    """id, created and model, shared by every chunk of one response."""

    model: str
    prefix: str = "chatcmpl"
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = f"{self.prefix}-{uuid.uuid4().hex[:24]}"


async def row_texts(stream: Any, counter: UsageCounter) -> AsyncIterator[tuple[str, str | None]]:
    """A row's (text, finish_reason) per delta, counting usage; the last item carries the finish reason.
    The row is closed however the caller leaves. Raises APIError 500 when the row failed or never finished."""
    try:
        async for delta in stream:
            counter.add(delta)
            if failure := stream_failure(delta.error, delta.finish_reason):
                raise APIError(500, failure, type="server_error")
            yield delta.text, delta.finish_reason
            if delta.finish_reason is not None:
                return
    finally:
        await close_stream(stream)
    raise APIError(500, "The generation ended without finishing (the engine stopped).", type="server_error")


def stream_failure(delta_error: str | None, finish_reason: str | None) -> str | None:
    """Why a row ended without a usable finish, or None when it finished normally. Raises nothing."""
    if delta_error:
        return delta_error
    if finish_reason == "cancelled":
        return "The generation was cancelled (the server is shutting down)."
    if finish_reason == "error":
        return "The generation failed."
    return None
