"""POST /v1/chat/completions: chat template → engine row → ChatCompletion or an SSE chunk stream.

Stream grammar: a role delta, content/reasoning/tool-call deltas, exactly one chunk carrying
finish_reason, the usage chunk (`choices: []`) when stream_options.include_usage, then `data: [DONE]`.
A failure after the headers went out is sent as `data: {"error": ...}` followed by `[DONE]`.
"""

from __future__ import annotations

import json
import logging
from typing import Any, AsyncGenerator

import anyio
from litestar import Request, Response, post

from service.app import AppState, get_state
from service.chat_deltas import ChatTranslator
from service.completions import ERROR_RESPONSES, completions
from service.errors import APIError, sse_error_event
from service.generation import (
    ResponseMeta,
    UsageCounter,
    chat_engine,
    close_stream,
    generation_request,
    row_texts,
    submit,
)
from service.openapi_spec import sse_operation
from service.schemas import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    ChoiceDelta,
    ChunkChoice,
)
from service.sse import (
    DONE,
    ClientDisconnected,
    EventSource,
    SSEStream,
    run_while_connected,
    sse_data,
)

__all__ = ["ROUTES", "chat_completions", "template_messages", "render_chat_prompt", "system_prefix_end"]

_log = logging.getLogger("tandem.service")

# Headers pi (and other agents) send to pick the prefix-cache entry to continue; a hint only.
AFFINITY_HEADERS = ("x-session-affinity", "session_id", "x-session-id")


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """OpenAI messages → the dicts chat templates expect (`developer` → `system`, parts joined,
    tool-call arguments as objects, prior thinking under `reasoning_content`). Raises nothing."""
    out: list[dict[str, Any]] = []
    for message in messages:
        item: dict[str, Any] = {
            "role": "system" if message.role == "developer" else message.role,
            "content": message.text(),
        }
        if message.name:
            item["name"] = message.name
        if message.tool_call_id:
            item["tool_call_id"] = message.tool_call_id
        if message.tool_calls:
            item["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments)},
                }
                for call in message.tool_calls
            ]
        if reasoning := (message.reasoning_content or message.reasoning):
            item["reasoning_content"] = reasoning
        out.append(item)
    return out


def _arguments(arguments: str | dict[str, Any]) -> Any:
    # Templates iterate over arguments (`arguments | items`) or dump them; an object serves both.
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return arguments
    return arguments


def _template_kwargs(body: ChatCompletionRequest) -> dict[str, Any]:
    kwargs = dict(body.chat_template_kwargs or {})
    if body.reasoning_effort == "none":
        kwargs.setdefault("enable_thinking", False)
    return kwargs


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, kwargs: dict[str, Any]) -> list[int]:
    if not getattr(tokenizer, "has_chat_template", True):
        # No template: plain "role: content" lines, as mlx-lm does.
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        return list(tokenizer.encode(text))
    tokens = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True, **kwargs)
    if isinstance(tokens, dict):  # some tokenizers return a BatchEncoding even with return_dict=False
        tokens = tokens["input_ids"]
    return [int(t) for t in tokens]


async def render_chat_prompt(state: AppState, engine: Any, body: ChatCompletionRequest) -> list[int]:
    """Token ids of the chat prompt (generation prompt appended), rendered off the event loop.

    Raises APIError 400 when the template rejects the conversation (e.g. roles out of order)."""
    messages = template_messages(body.messages)
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
    kwargs = _template_kwargs(body)
    try:
        return await anyio.to_thread.run_sync(_render, engine.tokenizer, messages, tools, kwargs, limiter=state.tokenize_limiter)
    except Exception as exc:  # jinja TemplateError, a template's raise_exception, a bad kwarg
        raise APIError(400, f"The chat template rejected these messages: {exc}", param="messages", code="invalid_messages") from exc


def _system_end(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any], prompt: list[int]) -> tuple[int, ...]:
    n = 0
    while n < len(messages) and messages[n]["role"] == "system":
        n += 1
    if n == 0 or n == len(messages) or not getattr(tokenizer, "has_chat_template", True):
        return ()
    # The system block as the template renders it before any user turn: its common prefix with the
    # prompt is what every conversation with this system prompt (and tools) shares.
    probe = _render(tokenizer, messages[:n] + [{"role": "user", "content": ""}], tools, kwargs)
    end = 0
    for a, b in zip(probe, prompt):
        if a != b:
            break
        end += 1
    return (end,) if 0 < end < len(prompt) else ()


async def system_prefix_end(state: AppState, engine: Any, body: ChatCompletionRequest, prompt: list[int]) -> tuple[int, ...]:
    """Token offset where the system prompt (and tool definitions) end: a prefix-cache segment boundary.

    Empty when there is no system message or the template cannot render one alone. Raises nothing."""
    messages = template_messages(body.messages)
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
    try:
        return await anyio.to_thread.run_sync(
            _system_end, engine.tokenizer, messages, tools, _template_kwargs(body), prompt, limiter=state.tokenize_limiter
        )
    except Exception:  # a template that insists on a full conversation: no boundary, no harm
        return ()


def _session_hint(request: Request[Any, Any, Any], body: ChatCompletionRequest) -> str | None:
    for header in AFFINITY_HEADERS:
        if value := request.headers.get(header):
            return value
    return body.prompt_cache_key


def _chunk(meta: ResponseMeta, delta: ChoiceDelta, finish: str | None = None) -> bytes:
    return sse_data(
        ChatCompletionChunk(
            id=meta.id,
            created=meta.created,
            model=meta.model,
            choices=[ChunkChoice(delta=delta, finish_reason=finish)],  # type: ignore[arg-type]
        )
    )


async def _chat_events(
    stream: Any, translator: ChatTranslator, meta: ResponseMeta, counter: UsageCounter, include_usage: bool
) -> AsyncGenerator[bytes, None]:
    try:
        yield _chunk(meta, ChoiceDelta(role="assistant", content=""))
        finish: str | None = None
        async for text, finish in row_texts(stream, counter):
            for choice_delta in translator.feed(text):
                yield _chunk(meta, choice_delta)
        for choice_delta in translator.finish():
            yield _chunk(meta, choice_delta)
        yield _chunk(meta, ChoiceDelta(), translator.finish_reason(finish))
        if include_usage:
            usage = ChatCompletionChunk(id=meta.id, created=meta.created, model=meta.model, choices=[], usage=counter.usage())
            yield sse_data(usage)
    except Exception as exc:  # headers are out: report in-band, then end the stream properly
        _log.warning("chat stream %s failed: %s", meta.id, exc)
        yield sse_error_event(str(exc))
    yield DONE


async def _collect(stream: Any, translator: ChatTranslator, meta: ResponseMeta, counter: UsageCounter) -> ChatCompletion:
    finish = None
    async for text, finish in row_texts(stream, counter):
        translator.feed(text)
    translator.finish()
    return ChatCompletion(
        id=meta.id,
        created=meta.created,
        model=meta.model,
        choices=[ChatChoice(message=translator.message(), finish_reason=translator.finish_reason(finish))],  # type: ignore[arg-type]
        usage=counter.usage(),
    )


@post(
    "/v1/chat/completions",
    status_code=200,
    summary="Create a chat completion",
    description="With `stream: true` the response is `text/event-stream` of ChatCompletionChunk events ending with `data: [DONE]`.",
    responses=ERROR_RESPONSES,
    operation_class=sse_operation(ChatCompletionChunk),
    tags=["chat"],
)
async def chat_completions(request: Request[Any, Any, Any], data: ChatCompletionRequest) -> Response[ChatCompletion]:
    """Chat completion, streamed or not. Raises APIError (4xx) for requests that cannot be served."""
    state = get_state(request)
    engine = chat_engine(state, data.model)
    prompt = await render_chat_prompt(state, engine, data)
    max_tokens = data.max_completion_tokens or data.max_tokens
    boundaries = await system_prefix_end(state, engine, data, prompt)
    generation = generation_request(engine, data, prompt, max_tokens, param="messages",
                                    session_id=_session_hint(request, data), segment_boundaries=boundaries)
    tools = [tool.model_dump(exclude_none=True) for tool in data.tools] if data.tools else None
    translator = ChatTranslator.for_request(engine.tokenizer, prompt, tools)
    meta = ResponseMeta(model=state.chat_model_name or "")
    counter = UsageCounter(prompt_tokens=len(prompt))
    stream = submit(engine, generation, param="messages")
    if data.stream:
        include_usage = bool(data.stream_options and data.stream_options.include_usage)
        events = _chat_events(stream, translator, meta, counter, include_usage)
        return SSEStream(EventSource(events, lambda: close_stream(stream)))  # type: ignore[return-value]
    try:
        completion = await run_while_connected(request, lambda: _collect(stream, translator, meta, counter))
    except ClientDisconnected:
        return Response(None, status_code=499)  # type: ignore[arg-type]
    return Response(completion)


ROUTES = [chat_completions, completions]
