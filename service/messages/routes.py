"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API (what Claude Code and the anthropic
SDKs speak), served by the chat machinery: the request becomes a chat request (service/messages/translate.py),
the reply's chat deltas become content blocks (service/messages/output.py).

A stream is message_start, the blocks' events, message_delta and message_stop; `ping` while the prompt waits (then
message_start follows the first token, whose delta says how much of the prompt the cache gave); an error after the
headers is a message_delta with the usage so far (stop_reason null), an `error` event, then the stream ends. Errors
before them are statuses with Anthropic's error body (service/messages/errors.py).
"""

from __future__ import annotations

import logging
from contextlib import aclosing
from typing import Any, AsyncGenerator

from litestar import Request, Response, post
from litestar.openapi.datastructures import ResponseSpec

from service.chat.output import ChatTranslator
from service.chat.prompt_limit import PromptTooLong
from service.chat.render import render_chat
from service.chat.request import chat_engine, renamed, request_timing
from service.chat.respond import respond
from service.chat.routes import submit_chat
from service.chat.stream import RowReader, UsageCounter
from service.http.access_log import record_tokens, record_user
from service.http.errors import APIError, in_band_error
from service.http.openapi import ok_content_operation, sse_event_schema
from service.messages.context_edits import PromptCounter, apply_edits
from service.messages.output import MessageOutput, stop_reason
from service.messages.replies import AnthropicError, MessageObject, MessageStreamEvent, OriginalTokens, TokenCount
from service.messages.schemas import CountTokensRequest, MessagesRequest
from service.messages.translate import anthropic_words, chat_fields, chat_request
from service.seams import ChatEngine, RowStream
from service.state import AppState
from service.state import get_state

__all__ = ["create_message", "count_message_tokens"]

_log = logging.getLogger("tandem.service")

_ERRORS = {status: ResponseSpec(data_container=AnthropicError, description=text, generate_examples=False)
           for status, text in {
               400: "Invalid request (invalid_request_error), naming the field",
               401: "Missing or wrong x-api-key (authentication_error)",
               404: "Unknown model (not_found_error)",
               413: "Body over the size limit (request_too_large)",
               429: "At capacity (rate_limit_error; Retry-After)",
               503: "Loading, restarting or shutting down (overloaded_error; Retry-After)",
               504: "Past --request-timeout (timeout_error)"}.items()}


def _usage(counter: UsageCounter) -> dict[str, Any]:
    """Anthropic's usage: input_tokens are the prompt's uncached tokens, the cached ones cache_read_input_tokens."""
    prompt, completion = counter.totals()
    cached = min(counter.cached_tokens, prompt)
    return {"input_tokens": prompt - cached, "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
            "output_tokens": completion}


def _renamed(exc: APIError, fields: dict[str, str]) -> APIError:
    """A chat error by the Messages request's names, in Anthropic's words, the field named in the message too
    (Anthropic's error body has no `param`); a prompt too long in Anthropic's own sentence, which Claude Code reads
    to compact the conversation. Raises nothing."""
    too_long = exc.anthropic_message if isinstance(exc, PromptTooLong) else None
    exc = renamed(exc, fields)
    message = too_long or anthropic_words(exc.message)
    if exc.status == 400 and exc.param and not message.startswith(exc.param) and too_long is None:
        message = f"{exc.param}: {message}"
    return APIError(exc.status, message, type=exc.type, param=exc.param, code=exc.code, retry_after=exc.retry_after,
                    close=exc.close, should_retry=exc.should_retry)


async def _reply(reader: RowReader, translator: ChatTranslator, output: MessageOutput) -> AsyncGenerator[bytes, None]:
    """The reply's events, what came together in one write, the end's last. Raises what reading the row raises."""
    finish: str | None = None
    async with aclosing(reader.items()) as items:  # closed (the row stopped) when the reply ends early
        async for text, finish in items:
            if events := [e for delta in translator.feed(text) for e in output.feed(delta)]:
                yield b"".join(events)
            if translator.done:  # disable_parallel_tool_use: the first call ended the reply
                finish = None
                break
    if reader.left:  # the client is gone: nothing is finished for it
        return
    events = [e for delta in translator.finish(cut=finish == "length") for e in output.feed(delta)]
    reason = stop_reason(translator.finish_reason(finish), reader.stop_sequence)
    events += output.close(reason, reader.stop_sequence if reason == "stop_sequence" else None)
    yield b"".join(events)


async def _events(reader: RowReader, translator: ChatTranslator, output: MessageOutput) -> AsyncGenerator[bytes, None]:
    if not output.started:
        yield output.opening()
    try:
        async with aclosing(_reply(reader, translator, output)) as events:
            async for event in events:
                yield event
    except Exception as exc:  # headers are out: report in-band; the stream ends with it
        _log.warning("message stream %s failed: %s", output.id, exc)
        yield output.failed(in_band_error(exc))


async def _collect(reader: RowReader, translator: ChatTranslator, output: MessageOutput) -> dict[str, Any]:
    async with aclosing(_reply(reader, translator, output)) as events:
        async for _ in events:  # a non-streamed output frames no events
            pass
    return output.message()


def _counter(state: AppState, engine: ChatEngine) -> PromptCounter:
    async def count(body: CountTokensRequest) -> int:
        return len((await render_chat(state, engine, chat_request(body))).tokens)
    return PromptCounter(count)


@post(
    "/v1/messages",
    status_code=200,
    summary="Create a message (Anthropic's Messages API)",
    description="Anthropic's Messages API, for Claude Code and the anthropic SDKs: `system`, the turns' `messages` "
                "(text, tool_use, tool_result, thinking blocks), client `tools` and `tool_choice`, `thinking` onto "
                "the chat template's switch. With `stream: true` the response is `text/event-stream` of `event: "
                "<type>` / `data: <json>` events from `message_start` to `message_stop` (an `error` event for an "
                "error after the headers). Errors are in Anthropic's shape.",
    responses=_ERRORS,
    operation_class=ok_content_operation({"text/event-stream": sse_event_schema(MessageStreamEvent, done=False)},
                                         "MessageStreamOperation"),
    tags=["messages"],
)
async def create_message(request: Request[Any, Any, Any], data: MessagesRequest) -> Response[MessageObject]:
    """A message, streamed or not. Raises APIError (4xx; 429 at capacity, 504 past the deadline) for requests that
    cannot be served."""
    state = get_state(request)
    engine = chat_engine(state, data.model)
    fields = chat_fields(data)
    try:
        edited, applied = await apply_edits(data, _counter(state, engine))
    except APIError as exc:
        raise _renamed(exc, fields) from None
    chat = chat_request(edited)
    timing = request_timing(request, state)
    counter = UsageCounter()
    record_tokens(request, counter.totals, lambda: counter.cached_tokens)
    record_user(request, data.metadata.user_id if data.metadata is not None else None)
    # The served model's id, as chat's and Anthropic's (an alias asked for answers with the model it resolved to).
    output = MessageOutput(state.chat_model_name or data.model, lambda: _usage(counter), streamed=bool(data.stream),
                           context={"applied_edits": applied} if data.context_management is not None else None,
                           thinking_shown=data.thinking is None or data.thinking.display != "omitted")
    translators: list[ChatTranslator] = []

    async def submit_row() -> RowStream:
        try:
            stream, _ = await submit_chat(request, state, engine, chat, counter, timing, translators)
        except APIError as exc:
            raise _renamed(exc, fields) from None
        return stream

    def failure(error: APIError) -> bytes:
        return output.opening() + output.failed(error)  # message_start unless it went out

    return await respond(
        request, counter, timing, submit_row=submit_row,
        events=(lambda reader: _events(reader, translators[0], output)) if data.stream else None,
        collect=lambda stream: _collect(RowReader(stream, counter, timing), translators[0], output),
        keepalive=output.keepalive, failure=failure,
        may_go_quiet=bool(chat.tools) or (data.thinking is not None and data.thinking.display == "omitted"))


@post("/v1/messages/count_tokens", status_code=200, summary="Count a message's prompt tokens",
      responses={200: ResponseSpec(data_container=TokenCount, description="The prompt's tokens",
                                   generate_examples=False), **_ERRORS},
      description="The tokens of the prompt a Messages request with this body would have (rendered with the chat "
                  "template, tools included).", tags=["messages"])
async def count_message_tokens(request: Request[Any, Any, Any],
                               data: CountTokensRequest) -> Response[dict[str, Any]]:
    """Raises APIError 400 (what rendering refuses) and 404 (another model)."""
    state = get_state(request)
    engine = chat_engine(state, data.model)
    count = _counter(state, engine)
    try:
        edited, _ = await apply_edits(data, count)
        tokens = await count(edited)
        original = await count(data) if data.context_management is not None else None
    except APIError as exc:
        raise _renamed(exc, chat_fields(data)) from None
    count_reply = TokenCount(input_tokens=tokens, context_management=None if original is None else
                             OriginalTokens(original_input_tokens=original))
    return Response(count_reply.model_dump(exclude_none=True))  # no context_management asked: none said
