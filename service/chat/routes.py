"""POST /v1/chat/completions: chat template → engine row → ChatCompletion or an SSE chunk stream.

Stream grammar: a role delta (with the first tool call or reasoning, else alone), content/reasoning/tool-call
deltas, exactly one chunk carrying finish_reason, the usage chunk (`choices: []`) when
stream_options.include_usage, then `data: [DONE]`.
A failure after the headers went out is sent as `data: {"error": ...}` followed by `[DONE]`.
"""

from __future__ import annotations

import logging
from contextlib import aclosing
from dataclasses import replace
from typing import Any, AsyncGenerator, Callable, Sequence

from litestar import Request, Response, post

from engine.contracts import GenerationRequest, TokenLogprob
from service.chat.logprobs import LogprobJson, TokenPieces, chat_logprobs, logprob_json, requested_logprobs, token_pieces
from service.chat.output import ChatTranslator
from service.chat.tool_text import request_tools
from service.chat.json_output import reply_grammar
from service.chat.legacy_functions import named_as_sent
from service.chat.prefill import check_no_grammar
from service.chat.render import RenderedPrompt, render_chat
from service.chat.request import chat_engine, generation_request, observe_queue_wait, request_timing, submit
from service.chat.choices import Choice, Choices, check_capacity, prime, respond_choices
from service.chat.replies import ChatChoice, ChatCompletion, ChatCompletionChunk, ChoiceDelta, FinishReason, Usage
from service.chat.schemas import ChatCompletionRequest, NamedToolChoice
from service.chat.chunks import ChunkEncoder
from service.chat.respond import failed_end, respond
from service.chat.structured_outputs import asked_constraint
from service.chat.stream import ResponseMeta, RowReader, StreamTiming, UsageCounter
from service.http.access_log import record_metadata, record_tokens, record_user
from service.http.auth import client_key
from service.http.errors import APIError, in_band_error
from service.http.openapi import CHAT_ERRORS, sse_operation
from service.http.sse import DONE, sse_data
from service.seams import ChatEngine, RowStream
from service.state import AppState, get_state

__all__ = ["chat_completions", "render_chat_prompt", "submit_chat"]

_log = logging.getLogger("tandem.service")

# Headers pi (and other agents) send to pick the prefix-cache entry to continue; a hint only.
AFFINITY_HEADERS = ("x-session-affinity", "session_id", "session-id", "x-session-id")


async def render_chat_prompt(state: AppState, engine: ChatEngine, body: ChatCompletionRequest) -> list[int]:
    """Token ids of the chat prompt (generation prompt appended), rendered off the event loop within the
    server's limits. Raises APIError 400 (service/chat/render.py)."""
    return (await render_chat(state, engine, body)).tokens


def _session_hint(request: Request[Any, Any, Any], body: ChatCompletionRequest) -> str | None:
    for header in AFFINITY_HEADERS:
        if value := request.headers.get(header):
            return value
    return body.prompt_cache_key


async def submit_chat(request: Request[Any, Any, Any], state: AppState, engine: ChatEngine,
                      body: ChatCompletionRequest, counter: UsageCounter, timing: StreamTiming,
                      translators: list[ChatTranslator], *,
                      logprobs: int | None = None, max_calls: int | None = None) -> tuple[RowStream, GenerationRequest]:
    """Render `body`, queue its row and return its stream and the request the engine took (its limits); the
    reply's translator is appended to `translators`; `max_calls`: the reply ends with its max_calls-th call (the
    Responses API's max_tool_calls). Shared by /v1/chat/completions and /v1/responses. Raises APIError (what
    rendering or the engine refuses)."""
    generation, translator = await _chat_request(request, state, engine, body, logprobs, max_calls)
    counter.prompt_tokens = len(generation.prompt_tokens)
    translators.append(translator())
    stream = submit(engine, generation, param="messages")
    observe_queue_wait(state, timing)
    return stream, generation


async def _chat_request(request: Request[Any, Any, Any], state: AppState, engine: ChatEngine,
                        body: ChatCompletionRequest, logprobs: int | None,
                        max_calls: int | None = None) -> tuple[GenerationRequest, Callable[[], ChatTranslator]]:
    """The engine request for `body` (rendered, its grammar prepared) and how to make a reply's translator (one per
    choice: it keeps the reply's state). Raises APIError (what rendering refuses)."""
    asked = asked_constraint(body, body.response_format)  # before rendering: a conflict is the body's own fault
    rendered = await render_chat(state, engine, body)
    prompt = rendered.tokens
    generation = generation_request(engine, body, prompt, body.reply_limit(),
                                    param="messages", session_id=_session_hint(request, body),
                                    segment_boundaries=rendered.boundaries,
                                    default_max_tokens=state.config.max_tokens_cap, tenant=client_key(request),
                                    logprobs=logprobs, continuation=bool(body.continue_final_message))
    calls, tools = bool(body.tools) and body.tool_choice != "none", request_tools(body)
    forced = _forced(body.tool_choice)
    try:
        if body.continue_final_message:
            check_no_grammar(body.response_format, forced and calls)  # vLLM's constraints follow the continuation
        grammar = await reply_grammar(body.response_format, tools, tokenizer=engine.tokenizer, calls=calls,
                                      opens_thinking=_opens_thinking(engine.tokenizer, rendered),
                                      json_calls=rendered.json_tool_calls, prepare=engine.prepare_grammar,
                                      forced=forced, asked=asked)
    except APIError as exc:
        raise named_as_sent(exc, body) from None  # functions and function_call by the names the client sent
    if grammar is not None:
        generation.sampling = replace(generation.sampling, grammar=grammar)
    # A named function's one call is the reply, as vLLM's ("required" may make several).
    one_call = body.parallel_tool_calls is False or isinstance(forced, str)
    return generation, lambda: ChatTranslator.for_request(engine.tokenizer, prompt, tools,
                                                          # only functions the request declared come back as calls
                                                          calls=calls,
                                                          one_call=one_call,
                                                          json_calls=rendered.json_tool_calls,
                                                          opening=rendered.generation_prompt,
                                                          forced_name=_forced_name(forced, tools),
                                                          max_calls=max_calls, legacy=body.legacy_reply())


def _forced(choice: Any) -> str | bool:
    """The function a tool_choice forces (its name), True for "required", False when the model decides."""
    if choice == "required":
        return True
    return choice.function.name if isinstance(choice, NamedToolChoice) else False


def _forced_name(forced: str | bool, tools: list[dict[str, Any]] | None) -> str | None:
    """The name every call of the reply must have: the function a tool_choice names, or "required"'s only one."""
    if isinstance(forced, str):
        return forced
    names = [tool["function"]["name"] for tool in tools or ()]
    return names[0] if forced and len(names) == 1 else None


def _opens_thinking(tokenizer: Any, rendered: RenderedPrompt) -> bool:
    """Whether the reply begins inside a thinking block (as ChatTranslator.for_request tells it). Raises nothing."""
    from engine.chat_output import opens_reasoning, starts_in_reasoning

    if rendered.generation_prompt is not None:
        return opens_reasoning(tokenizer, rendered.generation_prompt)
    return starts_in_reasoning(tokenizer, rendered.tokens)


_ROLE = b'"delta":{"role":"assistant"'  # how an opening delta's JSON begins (role is its first field)


class _Opening:
    """A streamed reply's chunks, the first once the reply's first delta is known, opened as OpenAI opens one: a
    role chunk with `content: ""` before text; the role with `content: null` on a first tool call's chunk (a legacy
    function_call's too, or reasoning's, which may end in calls), so the SDK's stream helper assembles the
    non-streamed reply's message."""

    def __init__(self, encode: ChunkEncoder) -> None:
        self._encode = encode.encode
        self._opened = False
        self._null_content = False  # opened with `content: null`: no chunk has said the content since

    def __call__(self, delta: ChoiceDelta, finish: FinishReason | None = None,
                 logprobs: Sequence[TokenLogprob] = ()) -> bytes:
        """The events for `delta` (two for the first of a text reply). Raises nothing."""
        if self._opened:
            return self._encode(delta, finish, logprobs)
        self._opened = True
        if delta.content is None and (delta.tool_calls or delta.function_call or delta.reasoning_content is not None):
            self._null_content = True
            event = self._encode(delta.model_copy(update={"role": "assistant"}), finish, logprobs)
            # A delta leaves a null content out; the opening one says it (the SDK's helper assembles from it).
            return event.replace(_ROLE, _ROLE + b',"content":null', 1)
        return self._encode(ChoiceDelta(role="assistant", content="")) + self._encode(delta, finish, logprobs)

    def closing(self, translator: ChatTranslator) -> bytes:
        """What goes before the finish chunk: the role chunk of a reply that said nothing, or `content: ""` where
        the stream left content null and the non-streamed reply has "" (reasoning alone). Raises nothing."""
        if not self._opened:
            self._opened = True
            return self._encode(ChoiceDelta(role="assistant", content=""))
        if self._null_content and translator.message().content == "":
            return self._encode(ChoiceDelta(content=""))
        return b""


async def _choice_chunks(reader: RowReader, translator: ChatTranslator, meta: ResponseMeta, include_usage: bool,
                         writer: LogprobJson | None = None, index: int = 0) -> AsyncGenerator[bytes, None]:
    """One choice's chunks: its opening, its text, reasoning and calls, its finish. Raises APIError (the row
    failed)."""
    chunk = _Opening(ChunkEncoder(meta, writer, usage=include_usage, index=index, counter=reader.counter))
    held: list[TokenLogprob] = []  # log probabilities of tokens whose text has not shown in a chunk yet

    def shown() -> list[TokenLogprob]:  # the held tokens, whose entries go with the chunk going out now
        nonlocal held
        taken, held = held, []
        return taken

    finish: str | None = None
    async with aclosing(reader.items()) as items:  # closed (the row stopped) when the reply ends early
        async for text, finish in items:
            if writer is None:  # the common case, kept to the text alone
                for choice_delta in translator.feed(text):
                    yield chunk(choice_delta)
            else:
                held += reader.take_logprobs()
                for choice_delta in translator.feed(text):
                    yield chunk(choice_delta, logprobs=shown())
            if translator.done:
                finish = None
                break
    if reader.left:  # the client is gone: nothing is finished for it (a call cut there is no bad block)
        return
    for choice_delta in translator.finish(cut=finish == "length"):
        yield chunk(choice_delta, logprobs=shown())
    if owed := chunk.closing(translator):
        yield owed
    yield chunk(ChoiceDelta(), translator.finish_reason(finish), logprobs=shown())


def _usage_chunk(meta: ResponseMeta, usage: Usage) -> bytes:
    return sse_data(ChatCompletionChunk(id=meta.id, created=meta.created, model=meta.model, choices=[], usage=usage))


async def _chat_events(
    reader: RowReader, translator: ChatTranslator, meta: ResponseMeta, counter: UsageCounter, include_usage: bool,
    writer: LogprobJson | None = None,
) -> AsyncGenerator[bytes, None]:
    try:
        async with aclosing(_choice_chunks(reader, translator, meta, include_usage, writer)) as chunks:
            async for event in chunks:
                yield event
        if include_usage:
            yield _usage_chunk(meta, counter.usage())
    except Exception as exc:  # headers are out: report in-band, then end the stream properly
        _log.warning("chat stream %s failed: %s", meta.id, exc)
        yield failed_end(in_band_error(exc), _usage_chunk(meta, counter.usage()) if include_usage else b"")
        return
    yield DONE


async def _chat_choice(reader: RowReader, translator: ChatTranslator, pieces: TokenPieces | None,
                       index: int = 0) -> ChatChoice:
    """One choice, read whole. Raises APIError (the row failed)."""
    finish = None
    tokens: list[TokenLogprob] = []
    async with aclosing(reader.items()) as items:
        async for text, finish in items:
            translator.feed(text)
            tokens += reader.take_logprobs()
            if translator.done:
                finish = None
                break
    translator.finish(cut=finish == "length")
    logprobs = chat_logprobs(pieces, tokens) if pieces is not None else None
    return ChatChoice(index=index, message=translator.message(), finish_reason=translator.finish_reason(finish),
                      logprobs=logprobs)


async def _collect(stream: RowStream, translator: ChatTranslator, meta: ResponseMeta, counter: UsageCounter,
                   timing: StreamTiming, pieces: TokenPieces | None = None) -> ChatCompletion:
    choice = await _chat_choice(RowReader(stream, counter, timing), translator, pieces)
    return ChatCompletion(id=meta.id, created=meta.created, model=meta.model, choices=[choice], usage=counter.usage())


@post(
    "/v1/chat/completions",
    status_code=200,
    summary="Create a chat completion",
    description="With `stream: true` the response is `text/event-stream` of ChatCompletionChunk events ending with "
                "`data: [DONE]`. Without `max_tokens` the server's --max-tokens-cap applies.",
    responses=CHAT_ERRORS,
    operation_class=sse_operation(ChatCompletionChunk),
    tags=["chat"],
)
async def chat_completions(request: Request[Any, Any, Any], data: ChatCompletionRequest) -> Response[ChatCompletion]:
    """Chat completion, streamed or not. Raises APIError (4xx; 429 at capacity, 504 past the deadline) for
    requests that cannot be served."""
    state = get_state(request)
    engine = chat_engine(state, data.model)
    timing = request_timing(request, state)
    meta = ResponseMeta(model=state.chat_model_name or "", continuous_usage=data.usage_every_chunk())
    counter = UsageCounter()
    record_tokens(request, counter.totals, lambda: counter.cached_tokens)
    record_user(request, data.user or data.safety_identifier)
    record_metadata(request, data.metadata)
    translators: list[ChatTranslator] = []
    if data.top_logprobs and not data.logprobs:
        raise APIError(400, "top_logprobs: needs logprobs: true", param="top_logprobs", code="invalid_value")
    logprobs = requested_logprobs(data.logprobs, data.top_logprobs)
    pieces = token_pieces(engine.tokenizer) if logprobs is not None else None

    include_usage = bool(data.stream_options and data.stream_options.include_usage)
    if (data.n or 1) > 1:
        check_capacity(state, data.n or 1)
        return await _choices(request, state, engine, data, meta, timing, logprobs, include_usage)

    async def submit_row() -> RowStream:
        stream, _ = await submit_chat(request, state, engine, data, counter, timing, translators, logprobs=logprobs)
        return stream

    return await respond(
        request, counter, timing, submit_row=submit_row,
        events=(lambda reader: _chat_events(reader, translators[0], meta, counter, include_usage,
                                            logprob_json(engine.tokenizer) if pieces is not None else None))
        if data.stream else None,
        collect=lambda stream: _collect(stream, translators[0], meta, counter, timing, pieces),
        failure=lambda error: failed_end(error, _usage_chunk(meta, counter.usage()) if include_usage else b""),
        may_go_quiet=bool(data.tools))


async def _choices(request: Request[Any, Any, Any], state: AppState, engine: ChatEngine, data: ChatCompletionRequest,
                   meta: ResponseMeta, timing: StreamTiming, logprobs: int | None,
                   include_usage: bool) -> Response[Any]:
    """`n` replies to one rendered prompt, each its own row and translator (service/chat/choices.py)."""
    choices: Choices[ChatTranslator] = Choices()
    record_tokens(request, choices.totals, lambda: choices.usage().prompt_tokens_details.cached_tokens)

    async def submit_all(into: Choices[ChatTranslator]) -> None:
        generation, translator = await _chat_request(request, state, engine, data, logprobs)
        generation.origin = into.origin  # the rows hold one place in the queue, not n
        into.primed_writes += await prime(engine, generation, timing, "messages")
        for sample in range(data.n or 1):
            row = replace(generation, choice=sample)  # waits behind other requests' earlier choices
            if sample and (seed := generation.sampling.seed) is not None:  # n samples differ, and repeat
                row.sampling = replace(generation.sampling, seed=(seed + sample) % (1 << 64))
            into.all.append(Choice(index=sample, first_sample=sample == 0,
                                   stream=submit(engine, row, param="messages"),
                                   timing=timing if sample == 0 else StreamTiming(timing.arrival, timing.deadline),
                                   # the prompt counted from its submission, as one choice's: a failure before the
                                   # first token still bills it
                                   counter=UsageCounter(prompt_tokens=len(row.prompt_tokens)),
                                   payload=translator()))
        observe_queue_wait(state, timing)

    pieces = token_pieces(engine.tokenizer) if logprobs is not None else None
    return await respond_choices(
        request, state, choices, submit_all=submit_all,
        events_of=(lambda c: _choice_chunks(c.reader, c.payload, meta, include_usage,
                                            logprob_json(engine.tokenizer) if pieces is not None else None, c.index))
        if data.stream else None,
        collect_of=lambda c: _chat_choice(c.reader, c.payload, pieces, c.index),
        whole=lambda answers, usage: ChatCompletion(id=meta.id, created=meta.created, model=meta.model,
                                                    choices=answers, usage=usage),
        usage_chunk=(lambda usage: _usage_chunk(meta, usage)) if include_usage else None)
