"""Request → engine: which engine serves the model asked for, OpenAI fields → GenerationRequest, submit.

Every check that can fail does so here, before response headers go out, so it becomes a plain 4xx.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import Any, Mapping, Sequence

from litestar import Request

from engine.contracts import GenerationRequest, SamplingParams
from engine.errors import EngineError
from service.chat.prompt_limit import check_prompt_fits
from service.chat.schemas import SamplingFields
from service.chat.stream import StreamTiming
from service.http.access_log import arrival_time
from service.http.errors import APIError, api_error, model_not_found, model_of_another_kind
from service.speech.served import speech_model_names
from service.seams import ChatEngine, RowStream
from service.state import AppState

__all__ = ["TGI_NAMES", "chat_engine", "vocab_size", "sampling_params", "generation_request", "submit",
           "request_timing", "observe_queue_wait", "renamed"]


# Names of whatever chat model is served, as TGI takes any `model`: its docs have OpenAI SDK users send "tgi", and
# huggingface_hub's InferenceClient sends "dummy" whenever its model is a URL (as "whisper-1" names the served Whisper).
TGI_NAMES = frozenset({"tgi", "dummy"})


def chat_engine(state: AppState, requested: str | None) -> ChatEngine:
    """The engine serving `requested` (None or "" = the loaded chat model; TGI_NAMES name it too).

    Raises APIError 404 model_not_found when no chat model with that name is served."""
    name = state.chat_model_name
    available = [card.id for card in state.model_cards()]
    if requested and name is not None and requested == "demo" and name == _demo_chat_id():
        requested = name  # "demo" names both demos (the CLI's `--model demo`): here the chat one
    if requested and requested in speech_model_names(state) and requested != name:
        raise model_of_another_kind(requested, "a speech-to-text model (POST /v1/audio/transcriptions, "
                                               "/v1/realtime)", name)
    if name is None:
        raise model_not_found(requested or "(default)", available)
    if requested and requested != name and requested not in state.model_aliases and requested not in TGI_NAMES:
        raise model_not_found(requested, available)
    assert state.engine is not None  # a chat model name implies an engine
    return state.engine


def _demo_chat_id() -> str:
    from engine.models import DEMO_MODEL_ID

    return DEMO_MODEL_ID


def vocab_size(engine: ChatEngine) -> int | None:
    """The model's vocabulary size when known. Raises nothing."""
    return engine.vocab_size


def sampling_params(body: SamplingFields, vocab: int | None, logprobs: int | None = None,
                    model_defaults: Mapping[str, float] | None = None) -> SamplingParams:
    """SamplingParams from the OpenAI fields (None → the model's recommendation in `model_defaults`, from its
    generation_config.json, else the engine's defaults); `logprobs`: how many likeliest tokens to report beside
    each sampled one (None: no log probabilities).

    Raises APIError 400 for a logit_bias token id outside the vocabulary."""
    bias: dict[int, float] | None = None
    if body.logit_bias:
        bias = {int(k): float(v) for k, v in body.logit_bias.items()}
        if vocab is not None and (bad := [t for t in bias if t >= vocab]):
            raise APIError(400, f"logit_bias: token id {bad[0]} is outside the vocabulary (size {vocab})",
                           param="logit_bias", code="invalid_value")
    # engine/models.py sampling_defaults, by field name; max_tokens is generation_request's.
    recommended: dict[str, Any] = {k: v for k, v in (model_defaults or {}).items() if k != "max_tokens"}
    defaults = replace(SamplingParams(), **recommended)
    greedy = body.top_p == 0  # a nucleus of nothing but the likeliest token
    return SamplingParams(
        temperature=0.0 if greedy else defaults.temperature if body.temperature is None else body.temperature,
        top_p=defaults.top_p if body.top_p is None or greedy else body.top_p,
        top_k=defaults.top_k if body.top_k is None else body.top_k,
        min_p=defaults.min_p if body.min_p is None else body.min_p,
        # OpenAI seeds are any integer; MLX keys take uint64: fold, so every seed is valid and stable.
        seed=None if body.seed is None else body.seed % (1 << 64),
        repetition_penalty=defaults.repetition_penalty if body.repetition_penalty is None else body.repetition_penalty,
        presence_penalty=defaults.presence_penalty if body.presence_penalty is None else body.presence_penalty,
        frequency_penalty=defaults.frequency_penalty if body.frequency_penalty is None else body.frequency_penalty,
        repetition_context_size=body.repetition_context_size,
        presence_context_size=body.presence_context_size,
        frequency_context_size=body.frequency_context_size,
        xtc_probability=defaults.xtc_probability if body.xtc_probability is None else body.xtc_probability,
        xtc_threshold=defaults.xtc_threshold if body.xtc_threshold is None else body.xtc_threshold,
        logit_bias=bias,
        logprobs=logprobs,
    )


def generation_request(
    engine: ChatEngine,
    body: SamplingFields,
    prompt: list[int],
    max_tokens: int | None,
    *,
    param: str,
    session_id: str | None = None,
    segment_boundaries: Sequence[int] = (),
    default_max_tokens: int | None = None,
    tenant: str | None = None,
    logprobs: int | None = None,
    continuation: bool = False,
) -> GenerationRequest:
    """Build the engine request. max_tokens defaults to the model's recommendation (generation_config.json's
    max_new_tokens) within `default_max_tokens` (the server's cap; None: no cap), and is capped at what the
    context has left. `tenant` (the API key's id) gets its own prefix-cache
    namespace, so one client's cached prefixes never show in another's `cached_tokens`.

    Raises PromptTooLong (400 context_length_exceeded, or context_over_budget under the memory budget) when the
    prompt leaves no room to generate."""
    context = engine.context_length
    if not prompt:
        raise APIError(400, "The prompt is empty after tokenization.", param=param, code="empty_prompt")
    if max_tokens is None and (recommended := engine.sampling_defaults.get("max_tokens")):
        default_max_tokens = min(int(recommended), default_max_tokens or int(recommended))
    room = max_tokens or default_max_tokens or 1 << 30
    check_prompt_fits(engine, len(prompt), param)
    if isinstance(context, int) and context > 0:
        room = min(room, context - len(prompt))  # the memory budget's room is the engine's to cap (admission.py)
    return GenerationRequest(
        prompt_tokens=list(prompt),
        sampling=sampling_params(body, vocab_size(engine), logprobs, engine.sampling_defaults),
        max_tokens=room,
        stop=tuple(body.stop_list()),
        session_id=session_id,
        namespace=(engine.model_name or "") + (f"#{tenant}" if tenant else ""),
        segment_boundaries=tuple(segment_boundaries),
        max_tokens_requested=max_tokens is not None,
        continuation=continuation,
        skip_special_tokens=body.skip_special_tokens is not False,
        min_tokens=body.min_tokens or 0,
        ignore_eos=bool(body.ignore_eos),
    )


def submit(engine: ChatEngine, request: GenerationRequest, *, param: str) -> RowStream:
    """Queue the request; returns the row's delta stream. `param` is the request field the prompt came from.

    Raises APIError by ERROR_TABLE for what the engine refuses (400 context_length_exceeded or
    invalid_value naming the field, 404 without a chat model, 503 while shutting down)."""
    try:
        return engine.submit(request)
    except EngineError as exc:
        raise api_error(exc, params={"prompt": param}) from exc


def request_timing(request: Request[Any, Any, Any], state: AppState) -> StreamTiming:
    """The request's arrival, its deadline (--request-timeout; none when 0) and the latency histograms.
    Raises nothing."""
    arrival = arrival_time(request)
    timeout = state.config.request_timeout
    metrics = state.metrics
    return StreamTiming(arrival, arrival + timeout if timeout > 0 else None,
                        ttft=metrics.ttft if metrics is not None else None,
                        itl=metrics.itl if metrics is not None else None)


def observe_queue_wait(state: AppState, timing: StreamTiming) -> None:
    """Record the wait from arrival to the engine taking the row. Raises nothing."""
    if state.metrics is not None:
        state.metrics.queue_wait.observe(time.monotonic() - timing.arrival)


def renamed(exc: APIError, fields: Mapping[str, str]) -> APIError:
    """`exc` naming the field of a translated request (/v1/responses, /v1/messages) its chat field came from, by
    `fields` (chat's top-level name → the API's). Raises nothing."""
    param = exc.param or ""
    # Chat nests a tool's fields under `function`; Responses and Messages do not.
    if (tool := re.fullmatch(r"tools\.(\d+)\.function\.(\w+)", param)) is not None:
        new = f"tools.{tool[1]}.{tool[2]}"
        return APIError(exc.status, exc.message, type=exc.type, param=new, code=exc.code, retry_after=exc.retry_after,
                        close=exc.close, should_retry=exc.should_retry)
    chat_name = param.split(".")[0].split("[")[0]
    if chat_name not in fields:
        return exc
    new = fields[chat_name]
    # Only the `param:` that opens chat's messages is chat's wording to replace ("these messages" stays a sentence).
    message = new + exc.message[len(param):] if exc.message.startswith(param + ":") else \
        exc.message.replace(f"in the {param},", f"in the {new},")  # check_text_fits's sentence
    return APIError(exc.status, message, type=exc.type, param=new, code=exc.code, retry_after=exc.retry_after,
                    close=exc.close, should_retry=exc.should_retry)
