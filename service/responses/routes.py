"""POST /v1/responses: OpenAI's Responses API (what Codex CLI speaks since it dropped chat completions, and what
the openai and openai-agents SDKs call by default), served by the chat machinery: the request becomes a chat
request (service/responses/history.py), the reply's chat deltas become output items (service/responses/output.py).

A request carries the conversation's items, or continues a response kept in memory (`previous_response_id`;
service/responses/item_cache.py). A stream starts with `response.created` and ends with `response.completed`,
`response.incomplete` (max_output_tokens) or `response.failed` then `error` (an error after the headers); no
`[DONE]`.
"""

from __future__ import annotations

import logging
from contextlib import aclosing
from functools import partial
from typing import Annotated, Any, AsyncGenerator, Awaitable, Callable, Literal

import anyio
from litestar import Request, Response, delete, get, post
from litestar.params import Parameter

from engine.contracts import TokenLogprob
from service.chat.logprobs import logprob_json
from service.chat.output import ChatTranslator
from service.chat.replies import ChoiceDelta
from service.chat.render import char_bound, render_chat
from service.chat.request import chat_engine, renamed, request_timing
from service.chat.respond import respond
from service.chat.routes import submit_chat
from service.chat.stream import RowReader, UsageCounter
from service.http.access_log import record_metadata, record_tokens, record_user
from service.http.auth import client_key
from service.http.errors import APIError, in_band_error
from service.http.openapi import CHAT_ERRORS, error_responses, sse_operation
from service.http.query import refuse_unknown_query
from service.responses.history import chat_request, input_items
from service.responses.input_list import LISTED_INCLUDABLE, input_page, sealed_output, with_ids
from service.responses.output import ResponseOutput
from service.responses.replies import (DeletedResponse, InputTokens, ResponseItemList, ResponseObject,
                                       ResponseStreamEvent)
from service.responses.schemas import (TEXT_LOGPROBS, UNOFFERED_TOOLS, HostedTool, InputTokensRequest,
                                       ResponsesRequest)
from service.responses.text_logprobs import TextTokens
from service.seams import RowStream
from service.state import AppState, get_state

__all__ = ["create_response", "count_input_tokens", "retrieve_response", "delete_response", "list_input_items"]

_log = logging.getLogger("tandem.service")

# Chat's field names in errors about the translated request → the Responses fields they came from.
# (submit names the prompt `messages`.)
_FIELDS = {"messages": "input", "reasoning_effort": "reasoning.effort", "max_tokens": "max_output_tokens",
           "response_format": "text.format"}


def _fields(body: ResponsesRequest) -> dict[str, str]:
    """_FIELDS for `body`: an effort sent at the top level (Open WebUI's `reasoning_effort`) keeps that name in
    errors, so the client reads the field it sent. Raises nothing."""
    return {**_FIELDS, "reasoning_effort": "reasoning_effort"} if body.reasoning_effort is not None else _FIELDS


async def _thinking_tokens(state: AppState, tokenizer: Any, thinking: list[str]) -> int:
    """How many tokens the reply's thinking is (usage's reasoning_tokens; 0 when the tokenizer cannot say), encoded
    in a worker thread one at a time, as every encoding is: HF tokenizers are not safe for concurrent use."""
    if not thinking:
        return 0
    try:
        encoded = await anyio.to_thread.run_sync(partial(tokenizer.encode, "".join(thinking), add_special_tokens=False),
                                                 limiter=state.tokenize_limiter)
    except Exception:  # noqa: BLE001 — usage detail only; never fail a reply over it
        return 0
    return len(encoded)


def _usage(counter: UsageCounter, reasoning_tokens: int) -> dict[str, Any]:
    prompt, completion = counter.totals()
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": counter.cached_tokens,
                                                             "cache_write_tokens": counter.cache_write_tokens},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens,
                                                                                           completion)},
            "total_tokens": prompt + completion}


# The reply's thinking → its tokens (_thinking_tokens for the request's server and tokenizer).
Counting = Callable[[list[str]], Awaitable[int]]


def _fed(output: ResponseOutput, deltas: list[ChoiceDelta], texts: TextTokens | None,
         tokens: Callable[[], list[TokenLogprob]]) -> list[bytes]:
    """The events of one piece of text's deltas, each content delta with its tokens when logprobs were included
    (`texts`; `tokens` takes those read since)."""
    if texts is None:
        return [e for delta in deltas for e in output.feed(delta)]
    return [e for delta, own in zip(deltas, texts.split(tokens(), deltas)) for e in output.feed(delta, own)]


async def _reply(reader: RowReader, translator: ChatTranslator, output: ResponseOutput, counter: UsageCounter,
                 count: Counting, kept: Callable[[dict[str, Any]], None],
                 texts: TextTokens | None = None) -> AsyncGenerator[bytes, None]:
    """The reply's events, what came together in one write, the finished response's last; `kept(final)` is told
    the finished Response; `texts`: the output text's tokens are sorted out (logprobs included). Raises what reading
    the row raises."""
    finish: str | None = None
    async with aclosing(reader.items()) as items:  # closed (the row stopped) when the reply ends early
        async for text, finish in items:
            if events := _fed(output, translator.feed(text), texts, reader.take_logprobs):
                yield b"".join(events)
            if translator.done:
                finish = None
                break
    if reader.left:  # the client is gone: nothing is finished for it, and a reply cut short is not kept as completed
        return
    events = _fed(output, translator.finish(cut=finish == "length"), texts, reader.take_logprobs)
    reason = translator.finish_reason(finish)
    events += output.close(incomplete=reason == "length")
    final = output.final(reason, _usage(counter, await count(output.thinking)))
    events.append(output.event(f"response.{final['status']}", response=final))
    kept(final)
    yield b"".join(events)


async def _events(reader: RowReader, translator: ChatTranslator, output: ResponseOutput, counter: UsageCounter,
                  count: Counting, kept: Callable[[dict[str, Any]], None],
                  texts: TextTokens | None = None) -> AsyncGenerator[bytes, None]:
    if not output.started:
        yield output.opening()
    try:
        async with aclosing(_reply(reader, translator, output, counter, count, kept, texts)) as events:
            async for event in events:
                yield event
    except Exception as exc:  # headers are out: report in-band; the stream ends with it
        _log.warning("response stream %s failed: %s", output.id, exc)
        yield output.failed(in_band_error(exc), _usage(counter, await count(output.thinking)))


async def _collect(reader: RowReader, translator: ChatTranslator, output: ResponseOutput, counter: UsageCounter,
                   count: Counting, kept: Callable[[dict[str, Any]], None],
                   texts: TextTokens | None = None) -> dict[str, Any]:
    finals: list[dict[str, Any]] = []

    def keep(final: dict[str, Any]) -> None:
        finals.append(final)
        kept(final)

    async with aclosing(_reply(reader, translator, output, counter, count, keep, texts)) as events:
        async for _ in events:  # a non-streamed output frames no events (ResponseOutput streamed=False)
            pass
    return finals[0]


def _continued(request: Request[Any, Any, Any], data: ResponsesRequest) -> list[dict[str, Any]]:
    """The kept conversation `previous_response_id` continues (none without one). Raises APIError 400
    (previous_response_not_found) naming the turn no longer kept."""
    if data.previous_response_id is None:
        return []
    tenant, kept_items = client_key(request), get_state(request).issued_items
    found = kept_items.conversation(tenant, data.previous_response_id)
    if found is None:
        missing = kept_items.missing_link(tenant, data.previous_response_id) or data.previous_response_id
        # an earlier turn deleted or forgotten: named, as GET of the one sent still finds it
        which = (f"no response {missing!r} is kept here" if missing == data.previous_response_id else
                 f"{data.previous_response_id!r} continues {missing!r}, which is no longer kept")
        raise APIError(400, f"previous_response_id: {which} (responses are kept a while unless deleted, and not "
                            "across restarts): send the conversation's items as input",
                       param="previous_response_id", code="previous_response_not_found")
    return found


def _unoffered(body: ResponsesRequest) -> list[str]:
    return [tool.type for tool in body.tools or () if isinstance(tool, HostedTool)]


@post(
    "/v1/responses",
    status_code=200,
    summary="Create a model response",
    description="OpenAI's Responses API: send the conversation's items as `input`, or the new ones with "
                "`previous_response_id` (responses are kept in memory a while, per API key, not across restarts). "
                "With `stream: true` the response is `text/event-stream` of `event: <type>` / `data: <json>` events "
                "from `response.created` to `response.completed` (`response.incomplete` when max_output_tokens cut "
                "the reply, `response.failed` for an error after the headers). OpenAI's tools Codex declares ("
                + ", ".join(UNOFFERED_TOOLS) + ") are accepted, not offered to the model and left out of the "
                "response's `tools`; OpenAI's others (file_search, code_interpreter, mcp, image_generation, "
                "computer_use_preview) are a 400 naming them, as is forcing any of them. Without "
                "`max_output_tokens` the server's --max-tokens-cap applies.",
    responses=CHAT_ERRORS,
    operation_class=sse_operation(ResponseStreamEvent),
    tags=["responses"],
)
async def create_response(request: Request[Any, Any, Any], data: ResponsesRequest) -> Response[ResponseObject]:
    """A model response, streamed or not. Raises APIError (4xx; 429 at capacity, 504 past the deadline) for
    requests that cannot be served."""
    state = get_state(request)
    engine = chat_engine(state, data.model)
    tenant, kept_items = client_key(request), state.issued_items
    earlier = _continued(request, data)
    items = input_items(data, lambda item_id: kept_items.referable(tenant, item_id), earlier, char_bound(engine))
    # This turn's input, resolved, each item with the id GET .../input_items lists it by.
    own = with_ids((item.model_dump(exclude_none=True) for item in items[len(earlier):]),
                   (item_id for item in earlier if isinstance(item_id := item.get("id"), str)))
    chat, names = chat_request(data, items)
    if unoffered := _unoffered(data):
        _log.info("hosted tools not offered to the model (none run here): %s", ", ".join(unoffered))
    timing = request_timing(request, state)
    counter = UsageCounter()
    record_tokens(request, counter.totals, lambda: counter.cached_tokens)
    record_user(request, data.user or data.safety_identifier)
    record_metadata(request, data.metadata)
    # include message.output_text.logprobs: each token's, with top_logprobs alternatives (as OpenAI, top_logprobs
    # alone asks for nothing)
    logprobs = (data.top_logprobs or 0) if TEXT_LOGPROBS in (data.include or ()) else None
    writer = logprob_json(engine.tokenizer) if logprobs is not None else None
    output = ResponseOutput(data, state.chat_model_name or "", names, streamed=bool(data.stream), logprobs=writer)
    translators: list[ChatTranslator] = []

    def texts() -> TextTokens | None:  # one per reply: it holds the reply's held-back tokens
        return TextTokens(writer.pieces) if writer is not None else None

    async def submit_row() -> RowStream:
        try:
            stream, generation = await submit_chat(request, state, engine, chat, counter, timing, translators,
                                                   logprobs=logprobs, max_calls=data.max_tool_calls or None)
        except APIError as exc:
            raise renamed(exc, _fields(data)) from None
        output.applied_limit = generation.max_tokens
        return stream

    def failure(error: APIError) -> bytes:  # before the first token: the prompt's usage, nothing generated
        return (b"" if output.started else output.opening()) + output.failed(error, _usage(counter, 0))

    def count(thinking: list[str]) -> Awaitable[int]:
        return _thinking_tokens(state, engine.tokenizer, thinking)

    def kept(final: dict[str, Any]) -> None:  # the reply's items, for references by id, and the response (store)
        if data.store is not False:  # store: false keeps nothing (as OpenAI: its items cannot be referred to)
            kept_items.keep(tenant, output.items)
            kept_items.keep_response(tenant, own, final)

    return await respond(
        request, counter, timing, submit_row=submit_row,
        events=(lambda reader: _events(reader, translators[0], output, counter, count, kept, texts()))
        if data.stream else None,
        collect=lambda stream: _collect(RowReader(stream, counter, timing), translators[0], output, counter, count,
                                        kept, texts()),
        keepalive=output.opening, failure=failure, may_go_quiet=bool(chat.tools))


@post("/v1/responses/input_tokens", status_code=200, summary="Count a response's input tokens", tags=["responses"],
      responses=CHAT_ERRORS,
      description="The tokens of the prompt a POST /v1/responses body with these fields would have: `instructions`, "
                  "the conversation `previous_response_id` continues, `input` (its `item_reference`s resolved) and "
                  "the tools, rendered with the chat template as /v1/responses renders them (`reasoning` and "
                  "`tool_choice` as they switch the template). openai-node's `responses.inputTokens.count`.")
async def count_input_tokens(request: Request[Any, Any, Any], data: InputTokensRequest) -> InputTokens:
    """Raises APIError 400 (what rendering or the Responses rules refuse; neither input nor previous_response_id),
    404 (another model)."""
    if data.input is None and data.previous_response_id is None:
        raise APIError(400, "input: give the input items, or previous_response_id (with or without input)",
                       param="input", code="invalid_value")
    state = get_state(request)
    engine = chat_engine(state, data.model)
    body, tenant = data.as_request(), client_key(request)
    items = input_items(body, lambda item_id: state.issued_items.referable(tenant, item_id),
                        _continued(request, body), char_bound(engine))
    chat, _ = chat_request(body, items)
    try:
        prompt = await render_chat(state, engine, chat)
    except APIError as exc:
        raise renamed(exc, _fields(body)) from None
    return InputTokens(input_tokens=len(prompt.tokens))


_NOT_KEPT = error_responses({404: "No such response is kept (code not_found)"})


def _kept_response(request: Request[Any, Any, Any], response_id: str) -> dict[str, Any]:
    found = get_state(request).issued_items.response(client_key(request), response_id)
    if found is None:
        raise APIError(404, f"No response with id {response_id!r} is kept here (responses are kept a while unless "
                            "created with store: false, and not across restarts).", param="response_id",
                       code="not_found")
    return found


def _known_query(request: Request[Any, Any, Any], known: frozenset[str], reads: str) -> None:
    """Raises APIError 400 naming the first query parameter not in `known` (`reads`: what the route reads); Azure's
    api-version passes (service/http/query.py)."""
    refuse_unknown_query(request.query_params, known, reads)


_RETRIEVE_QUERY = frozenset({"stream", "starting_after", "include_obfuscation", "include", "include[]"})
# OpenAI streams a retrieval only of a response still running in the background; none runs so here.
_NOT_STREAMED = ("only a response running in the background can be streamed on retrieval, and responses are not "
                 "run in the background here: GET without it gives the finished response")


@get("/v1/responses/{response_id:str}", summary="Retrieve a kept response", tags=["responses"],
     responses={**_NOT_KEPT, **error_responses({400: "Invalid query (OpenAI error shape)"})},
     description="A finished response created without `store: false`, while it is kept. `include` (as `include[]` "
                 "too): only " + ", ".join(LISTED_INCLUDABLE) + " (each reasoning item carries the thinking, "
                 "sealed). `stream` (only false) and `starting_after` are refused: only a background response "
                 "streams, and none runs in the background here; unknown query parameters are a 400 naming them.")
async def retrieve_response(
    request: Request[Any, Any, Any], response_id: str,
    stream: Annotated[bool | None, Parameter(description="Only false: no response is streamed on retrieval.")]
    = None,
    starting_after: Annotated[int | None, Parameter(description="Refused: only a streamed retrieval reads it.")]
    = None,
    include_obfuscation: Annotated[bool | None, Parameter(description="Only false: events are never padded.")]
    = None,
    include: Annotated[list[str] | None, Parameter(description="Extra fields: only reasoning.encrypted_content.")]
    = None,
    include_brackets: Annotated[list[str] | None, Parameter(query="include[]", description="As `include`.")] = None,
) -> ResponseObject:
    """The response as it finished. Raises APIError 404 for one not kept, 400 naming a query parameter that is
    unknown or not honoured."""
    _known_query(request, _RETRIEVE_QUERY, "this route reads include; stream, starting_after and "
                                           "include_obfuscation only as false or absent")
    if stream:
        raise APIError(400, f"stream: {_NOT_STREAMED}", param="stream", code="invalid_value")
    if starting_after is not None:
        raise APIError(400, f"starting_after: a streamed retrieval's event number; {_NOT_STREAMED}",
                       param="starting_after", code="invalid_value")
    if include_obfuscation:
        raise APIError(400, "include_obfuscation: events are never padded here (and no retrieval is streamed): only "
                            "false is supported", param="include_obfuscation", code="invalid_value")
    found = _kept_response(request, response_id)
    return ResponseObject.model_validate(sealed_output(found, [*(include or ()), *(include_brackets or ())]))


@delete("/v1/responses/{response_id:str}", status_code=200, summary="Delete a kept response", tags=["responses"],
        responses={**_NOT_KEPT, **error_responses({400: "Invalid query (OpenAI error shape)"})},
        description="Forgets the response, its input items and the output items it gave (an `item_reference` to "
                    "any of them is then a 400). It takes no query parameters (a 400 names one).")
async def delete_response(request: Request[Any, Any, Any], response_id: str) -> DeletedResponse:
    """Raises APIError 404 for a response not kept, 400 naming a query parameter."""
    _known_query(request, frozenset(), "this route reads none")
    response = _kept_response(request, response_id)
    issued, tenant = get_state(request).issued_items, client_key(request)
    # What it said goes with it: a user deleting a reply must not find its text still served by reference.
    for item in response.get("output", []):
        if isinstance(item.get("id"), str):
            issued.forget(tenant, item["id"])
    issued.forget(tenant, response_id)
    return DeletedResponse(id=response_id)


_LIST_QUERY = frozenset({"limit", "order", "after", "include", "include[]"})


@get("/v1/responses/{response_id:str}/input_items", summary="List a kept response's input items",
     tags=["responses"], responses={**_NOT_KEPT, **error_responses({400: "Invalid query (OpenAI error shape)"})},
     description="The items the response was made from — the conversation it continued (as far back as it is still "
                 "kept) and its own input — each with an `id` (the one it was sent with, else one given it when the "
                 "response was kept), a page at a time (`has_more`; the next page `after` the last `id`). `include` "
                 "(as `include[]` too, as the SDKs send it): only " + ", ".join(LISTED_INCLUDABLE) + ".")
async def list_input_items(
    request: Request[Any, Any, Any], response_id: str,
    limit: Annotated[int, Parameter(ge=1, le=100, description="Items in the page, 1 to 100.")] = 20,
    order: Annotated[Literal["asc", "desc"], Parameter(description="asc: oldest first; desc: newest first.")] = "desc",
    after: Annotated[str | None, Parameter(description="An item id: the page starts after it.")] = None,
    include: Annotated[list[str] | None, Parameter(description="Extra fields: only reasoning.encrypted_content.")]
    = None,
    include_brackets: Annotated[list[str] | None, Parameter(query="include[]", description="As `include`.")] = None,
) -> ResponseItemList:
    """A page of the response's input items. Raises APIError 404 for a response not kept, 400 naming a query
    parameter that is unknown or not honoured."""
    _known_query(request, _LIST_QUERY, "this route reads limit, order, after and include")
    _kept_response(request, response_id)
    items = get_state(request).issued_items.response_input(client_key(request), response_id) or []
    return ResponseItemList.model_validate(input_page(items, limit=limit, order=order, after=after,
                                                      include=[*(include or ()), *(include_brackets or ())]))
