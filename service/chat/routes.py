"""POST /v1/chat/completions: chat template → engine row → ChatCompletion or an SSE chunk stream.

Stream grammar: a role delta, content/reasoning/tool-call deltas, exactly one chunk carrying
finish_reason, the usage chunk (`choices: []`) when stream_options.include_usage, then `data: [DONE]`.
A failure after the headers went out is sent as `data: {"error": ...}` followed by `[DONE]`.
"""

from __future__ import annotations

import logging
from typing import Any, AsyncGenerator

import anyio
from litestar import Request, Response, post

from service.chat.output import ChatTranslator
from service.chat.prompt import render_prompt, request_tools, system_prefix_end, template_kwargs, template_messages
from service.chat.request import chat_engine, generation_request, submit
from service.chat.schemas import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChoiceDelta,
)
from service.chat.chunks import ChunkEncoder
from service.chat.stream import ResponseMeta, RowReader, UsageCounter, close_stream, row_texts
from service.http.access_log import record_tokens
from service.http.disconnect import ClientDisconnected, run_while_connected
from service.http.errors import APIError, in_band_error
from service.http.openapi import MODEL_ERRORS, sse_operation
from service.http.sse import DONE, EventSource, SSEStream, sse_data, sse_error
from service.seams import ChatEngine, RowStream
from service.state import AppState, get_state

__all__ = ["chat_completions", "render_chat_prompt"]

_log = logging.getLogger("tandem.service")

# Headers pi (and other agents) send to pick the prefix-cache entry to continue; a hint only.
AFFINITY_HEADERS = ("x-session-affinity", "session_id", "x-session-id")


async def render_chat_prompt(state: AppState, engine: ChatEngine, body: ChatCompletionRequest) -> list[int]:
    """Token ids of the chat prompt (generation prompt appended), rendered off the event loop.

    Raises APIError 400 when the template rejects the conversation (e.g. roles out of order)."""
    messages, tools, kwargs = template_messages(body.messages), request_tools(body), template_kwargs(body)
    try:
        return await anyio.to_thread.run_sync(render_prompt, engine.tokenizer, messages, tools, kwargs,
                                              limiter=state.tokenize_limiter)
    except Exception as exc:  # jinja TemplateError, a template's raise_exception, a bad kwarg
        raise APIError(400, f"The chat template rejected these messages: {exc}", param="messages",
                       code="invalid_messages") from exc


async def _system_boundary(state: AppState, engine: ChatEngine, body: ChatCompletionRequest,
                           prompt: list[int]) -> tuple[int, ...]:
    messages, tools, kwargs = template_messages(body.messages), request_tools(body), template_kwargs(body)
    return await anyio.to_thread.run_sync(system_prefix_end, engine.tokenizer, messages, prompt, tools, kwargs,
                                          limiter=state.tokenize_limiter)


def _session_hint(request: Request[Any, Any, Any], body: ChatCompletionRequest) -> str | None:
    for header in AFFINITY_HEADERS:
        if value := request.headers.get(header):
            return value
    return body.prompt_cache_key


async def _chat_events(
    reader: RowReader, translator: ChatTranslator, meta: ResponseMeta, counter: UsageCounter, include_usage: bool
) -> AsyncGenerator[bytes, None]:
    chunk = ChunkEncoder(meta).encode
    try:
        yield chunk(ChoiceDelta(role="assistant", content=""))
        finish: str | None = None
        async for text, finish in reader.items():
            for choice_delta in translator.feed(text):
                yield chunk(choice_delta)
        for choice_delta in translator.finish():
            yield chunk(choice_delta)
        yield chunk(ChoiceDelta(), translator.finish_reason(finish))
        if include_usage:
            usage = ChatCompletionChunk(id=meta.id, created=meta.created, model=meta.model, choices=[], usage=counter.usage())
            yield sse_data(usage)
    except Exception as exc:  # headers are out: report in-band, then end the stream properly
        _log.warning("chat stream %s failed: %s", meta.id, exc)
        yield sse_error(in_band_error(exc))
    yield DONE


async def _collect(stream: RowStream, translator: ChatTranslator, meta: ResponseMeta, counter: UsageCounter) -> ChatCompletion:
    finish = None
    async for text, finish in row_texts(stream, counter):
        translator.feed(text)
    translator.finish()
    return ChatCompletion(
        id=meta.id,
        created=meta.created,
        model=meta.model,
        choices=[ChatChoice(message=translator.message(), finish_reason=translator.finish_reason(finish))],
        usage=counter.usage(),
    )


@post(
    "/v1/chat/completions",
    status_code=200,
    summary="Create a chat completion",
    description="With `stream: true` the response is `text/event-stream` of ChatCompletionChunk events ending with `data: [DONE]`.",
    responses=MODEL_ERRORS,
    operation_class=sse_operation(ChatCompletionChunk),
    tags=["chat"],
)
async def chat_completions(request: Request[Any, Any, Any], data: ChatCompletionRequest) -> Response[ChatCompletion]:
    """Chat completion, streamed or not. Raises APIError (4xx) for requests that cannot be served."""
    state = get_state(request)
    engine = chat_engine(state, data.model)
    prompt = await render_chat_prompt(state, engine, data)
    max_tokens = data.max_completion_tokens or data.max_tokens
    boundaries = await _system_boundary(state, engine, data, prompt)
    generation = generation_request(engine, data, prompt, max_tokens, param="messages",
                                    session_id=_session_hint(request, data), segment_boundaries=boundaries)
    translator = ChatTranslator.for_request(engine.tokenizer, prompt, request_tools(data))
    meta = ResponseMeta(model=state.chat_model_name or "")
    counter = UsageCounter(prompt_tokens=len(prompt))
    record_tokens(request, counter.totals)
    stream = submit(engine, generation, param="messages")
    if data.stream:
        include_usage = bool(data.stream_options and data.stream_options.include_usage)
        reader = RowReader(stream, counter)
        try:  # a row that fails before its first token is answered with a 5xx, not an empty 200 stream
            await run_while_connected(request, reader.start)
        except ClientDisconnected:
            return Response(None, status_code=499)  # type: ignore[arg-type]  # no body for a client that left
        events = _chat_events(reader, translator, meta, counter, include_usage)
        # stream=true answers with SSE instead of the JSON body (documented by sse_operation).
        return SSEStream(EventSource(events, lambda: close_stream(stream)))  # type: ignore[return-value]
    try:
        completion = await run_while_connected(request, lambda: _collect(stream, translator, meta, counter))
    except ClientDisconnected:
        return Response(None, status_code=499)  # type: ignore[arg-type]  # no body for a client that left
    return Response(completion)

