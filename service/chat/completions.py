"""POST /v1/completions: one raw prompt (text or token ids) → Completion or an SSE stream of them.

Same stream grammar as chat, minus the role delta: text chunks, one chunk with finish_reason, the usage
chunk (`choices: []`) when asked, then `data: [DONE]`.
"""

from __future__ import annotations

import logging
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any, AsyncGenerator

import anyio
from litestar import Request, Response, post

from service.chat.render import check_text_fits
from service.chat.request import chat_engine, generation_request, observe_queue_wait, request_timing, submit, vocab_size
from service.chat.logprobs import CompletionLogprobWriter, TokenPieces, requested_logprobs, token_pieces
from service.chat.replies import Completion, CompletionChoice, CompletionLogprobs, FinishReason
from service.chat.choices import Choice, Choices, check_capacity, prime, respond_choices
from service.chat.chunk_usage import ChunkUsage
from service.chat.completion_request import CompletionRequest
from service.chat.infill import Infill, infill_tokens, requested_infill
from service.chat.respond import failed_end, respond
from service.chat.json_output import answer_grammar, asks_answer
from service.chat.structured_outputs import asked_constraint
from service.chat.stream import ResponseMeta, RowReader, StreamTiming, UsageCounter
from service.http.access_log import record_metadata, record_tokens, record_user
from service.http.auth import client_key
from service.http.errors import APIError, in_band_error
from service.http.openapi import CHAT_ERRORS, sse_operation
from service.http.sse import DONE, sse_data
from engine.contracts import GenerationRequest, GrammarSpec
from engine.special_tokens import hidden_special_ids
from service.seams import ChatEngine, RowStream
from service.state import AppState, get_state

__all__ = ["completions"]

_log = logging.getLogger("tandem.service")


async def _prompt_tokens(state: AppState, engine: ChatEngine, prompt: str | list[int],
                         echo: bool, infill: Infill | None = None) -> tuple[list[int], str]:
    """One prompt's token ids (with `infill`, the model's fill-in-the-middle prompt around its suffix), and its text
    when it is echoed. Raises APIError 400 (an id outside the vocabulary, text that cannot fit)."""
    tokenizer = engine.tokenizer
    assert tokenizer is not None  # chat_engine returns only an engine serving a chat model
    if infill is not None and isinstance(prompt, str):  # never echoed: the schema refuses echo with a suffix
        return await infill_tokens(state, engine, infill, prompt), ""
    if isinstance(prompt, list):
        tokens = [int(t) for t in prompt]
        vocab = vocab_size(engine)
        if vocab is not None and (bad := [t for t in tokens if t >= vocab]):
            raise APIError(400, f"prompt: token id {bad[0]} is outside the vocabulary (size {vocab})", param="prompt",
                           code="invalid_value")
        return tokens, _echoed(tokenizer, tokens) if echo else ""
    check_text_fits(len(prompt), engine, "prompt")  # before tokenizing text that cannot fit
    encoded = await anyio.to_thread.run_sync(tokenizer.encode, prompt, limiter=state.tokenize_limiter)
    return [int(t) for t in encoded], prompt


def _echoed(tokenizer: Any, tokens: list[int]) -> str:
    """A token-id prompt's text as echoed: less a last character its bytes leave unfinished, which the reply's text
    begins with once its bytes finish it (engine/stop_matcher.py), as a decode of the two together writes it.
    Raises what the tokenizer's `decode` raises."""
    text = tokenizer.decode(tokens)
    return text.rstrip("\ufffd") if token_pieces(tokenizer).unfinished_tail(tokens)[0] else text


@dataclass
class _Echo:
    """A choice's echoed prompt, and the prompt's tokens when their log probabilities go with it."""

    text: str
    prompt: list[int] | None


def _chunk(meta: ResponseMeta, text: str, usage: ChunkUsage, finish: FinishReason | None = None,
           logprobs: CompletionLogprobs | None = None, index: int = 0) -> bytes:
    """`usage`: what the chunk says of usage (service/chat/chunk_usage.py)."""
    return usage.mark(sse_data(
        Completion(
            id=meta.id,
            created=meta.created,
            model=meta.model,
            choices=[CompletionChoice(index=index, text=text, finish_reason=finish, logprobs=logprobs)],
        )
    ))


def _prompt_logprobs(writer: CompletionLogprobWriter | None, reader: RowReader,
                     prompt: list[int] | None) -> CompletionLogprobs | None:
    """The echoed prompt's lists, when asked (`prompt`: its tokens); the engine sent them with the first delta.
    Raises APIError 500 when it did not."""
    if writer is None or prompt is None:
        return None
    scored = reader.take_prompt_logprobs()
    if scored is None:  # a failure, not a successful answer without them
        raise APIError(500, "the prompt's log probabilities did not come back", type="server_error")
    return writer.prompt(prompt, scored)


def _joined(first: CompletionLogprobs | None, then: CompletionLogprobs) -> CompletionLogprobs:
    if first is None:
        return then
    return CompletionLogprobs(tokens=first.tokens + then.tokens,
                              token_logprobs=first.token_logprobs + then.token_logprobs,
                              top_logprobs=first.top_logprobs + then.top_logprobs,
                              text_offset=first.text_offset + then.text_offset)


async def _choice_events(reader: RowReader, meta: ResponseMeta, include_usage: bool, echo: str,
                         pieces: TokenPieces | None, prompt: list[int] | None,
                         index: int = 0, scoring: bool = False,
                         hidden: frozenset[int] = frozenset()) -> AsyncGenerator[bytes, None]:
    """One choice's chunks: the echo (with the prompt's log probabilities when asked), its text, its finish
    (`scoring`: max_tokens 0, the echo alone). Raises APIError (the row failed)."""
    writer = CompletionLogprobWriter(pieces, len(echo), hidden) if pieces is not None else None
    usage = ChunkUsage(include_usage, reader.counter if meta.continuous_usage else None)
    if echo or prompt is not None:
        yield _chunk(meta, echo, usage, logprobs=_prompt_logprobs(writer, reader, prompt), index=index)
    finish: str | None = None
    async for text, finish in reader.items():
        tokens = reader.take_logprobs() if writer is not None else []
        if (text or tokens) and not scoring:
            logprobs = writer.write(tokens) if writer is not None else None
            yield _chunk(meta, text, usage, logprobs=logprobs, index=index)
    yield _chunk(meta, "", usage, "length" if finish == "length" or scoring else "stop", index=index)


async def _events(
    reader: RowReader, meta: ResponseMeta, counter: UsageCounter, include_usage: bool, echo: str,
    pieces: TokenPieces | None = None, prompt: list[int] | None = None, scoring: bool = False,
    hidden: frozenset[int] = frozenset(),
) -> AsyncGenerator[bytes, None]:
    """`prompt`: the prompt's tokens when its log probabilities go with the echo."""
    try:
        async with aclosing(_choice_events(reader, meta, include_usage, echo, pieces, prompt,
                                           scoring=scoring, hidden=hidden)) as chunks:
            async for chunk in chunks:
                yield chunk
        if include_usage:
            yield _usage_chunk(meta, counter)
    except Exception as exc:  # headers are out: report in-band, then end the stream properly
        _log.warning("completion stream %s failed: %s", meta.id, exc)
        yield failed_end(in_band_error(exc), _usage_chunk(meta, counter) if include_usage else b"")
        return
    yield DONE


def _usage_chunk(meta: ResponseMeta, counter: UsageCounter) -> bytes:
    return sse_data(Completion(id=meta.id, created=meta.created, model=meta.model, choices=[], usage=counter.usage()))


async def _choice(reader: RowReader, echo: str, pieces: TokenPieces | None, prompt: list[int] | None,
                  index: int = 0, scoring: bool = False, hidden: frozenset[int] = frozenset()) -> CompletionChoice:
    """One choice, read whole (`scoring`: max_tokens 0, the echo alone). Raises APIError (the row failed)."""
    parts, finish = [echo], None
    async for text, finish in reader.items():
        parts.append(text)
    writer = CompletionLogprobWriter(pieces, len(echo), hidden) if pieces is not None else None
    reply = reader.take_logprobs()
    if scoring:
        parts, reply, finish = [echo], [], "length"
    logprobs = _joined(_prompt_logprobs(writer, reader, prompt), writer.write(reply)) if writer is not None else None
    return CompletionChoice(index=index, text="".join(parts), finish_reason="length" if finish == "length" else "stop",
                            logprobs=logprobs)


async def _collect(stream: RowStream, meta: ResponseMeta, counter: UsageCounter, echo: str,
                   timing: StreamTiming, pieces: TokenPieces | None = None,
                   prompt: list[int] | None = None, scoring: bool = False,
                   hidden: frozenset[int] = frozenset()) -> Completion:
    choice = await _choice(RowReader(stream, counter, timing), echo, pieces, prompt, scoring=scoring, hidden=hidden)
    return Completion(id=meta.id, created=meta.created, model=meta.model, choices=[choice], usage=counter.usage())


@post(
    "/v1/completions",
    status_code=200,
    summary="Create a text completion",
    description="With `stream: true` the response is `text/event-stream` of Completion events ending with `data: [DONE]`.",
    responses=CHAT_ERRORS,
    operation_class=sse_operation(Completion),
    tags=["completions"],
)
async def completions(request: Request[Any, Any, Any], data: CompletionRequest) -> Response[Completion]:
    """Text completion, streamed or not. Raises APIError (4xx; 429 at capacity, 504 past the deadline) for
    requests that cannot be served."""
    state = get_state(request)
    engine = chat_engine(state, data.model)
    timing = request_timing(request, state)
    meta = ResponseMeta(model=state.chat_model_name or "", prefix="cmpl", continuous_usage=data.usage_every_chunk())
    record_user(request, data.user or data.safety_identifier)
    record_metadata(request, data.metadata)
    logprobs = requested_logprobs(data.logprobs)
    pieces = token_pieces(engine.tokenizer) if logprobs is not None else None
    # The tokens a reply's text leaves out: its offsets do not move past them (only asked for with log probabilities).
    hidden = hidden_special_ids(engine.tokenizer) if pieces is not None and data.skip_special_tokens is not False \
        else frozenset()
    include_usage = bool(data.stream_options and data.stream_options.include_usage)
    items, samples = data.prompt_items(), data.n or 1
    infill = requested_infill(engine, data)
    # vLLM's constraint, compiled once for every row: the reply follows it from its first token.
    asked = asked_constraint(data, data.response_format)
    grammar = GrammarSpec(await answer_grammar(data.response_format, asked, engine.prepare_grammar)) \
        if asks_answer(data.response_format, asked) else None
    # max_tokens 0 with echo (OpenAI's scoring idiom): the prompt's log probabilities alone; the one token the engine
    # writes is not given.
    scoring = data.reply_limit() == 0
    limit = 1 if scoring else data.reply_limit() or data.DEFAULT_MAX_TOKENS

    def row(prompt: list[int], sample: int) -> GenerationRequest:
        generation = generation_request(engine, data, prompt, limit,
                                        param="prompt", tenant=client_key(request), logprobs=logprobs,
                                        continuation=True)
        # Echoed with logprobs: the prompt's own too (what evaluation harnesses score text by).
        if data.echo and logprobs is not None:
            generation.prompt_logprobs = logprobs
        if infill is not None:  # a family's end of the middle that is not its eos (CodeLlama's ▁<EOT>)
            generation.stop_token_ids = infill.format.stop_ids
        if grammar is not None:
            generation.sampling = replace(generation.sampling, grammar=grammar)
        if sample and (seed := generation.sampling.seed) is not None:  # a seed's n samples differ, and repeat
            generation.sampling = replace(generation.sampling, seed=(seed + sample) % (1 << 64))
        return generation

    if len(items) * samples > 1:
        check_capacity(state, samples, len(items))
        choices: Choices[_Echo] = Choices()
        record_tokens(request, choices.totals, lambda: choices.usage().prompt_tokens_details.cached_tokens)

        async def submit_all(into: Choices[_Echo]) -> None:
            for number, item in enumerate(items):
                prompt, prompt_text = await _prompt_tokens(state, engine, item, bool(data.echo), infill)
                if samples > 1:  # a later prompt's primer is a later choice: it waits as they do, never refused
                    into.primed_writes += await prime(
                        engine, replace(row(prompt, 0), choice=number * samples, origin=into.origin), timing, "prompt")
                for sample in range(samples):
                    generation = replace(row(prompt, sample), choice=number * samples + sample, origin=into.origin)
                    first = number * samples + sample == 0
                    into.all.append(Choice(
                        index=number * samples + sample, first_sample=sample == 0,
                        stream=submit(engine, generation, param="prompt"),
                        timing=timing if first else StreamTiming(timing.arrival, timing.deadline),
                        counter=UsageCounter(len(prompt), reply_given=not scoring),  # counted as one choice's
                        payload=_Echo(prompt_text if data.echo else "",
                                      prompt if generation.prompt_logprobs is not None else None)))
            observe_queue_wait(state, timing)

        return await respond_choices(
            request, state, choices, submit_all=submit_all,
            events_of=(lambda c: _choice_events(c.reader, meta, include_usage, c.payload.text, pieces,
                                                c.payload.prompt, c.index, scoring, hidden)) if data.stream else None,
            collect_of=lambda c: _choice(c.reader, c.payload.text, pieces, c.payload.prompt, c.index, scoring,
                                         hidden),
            whole=lambda answers, usage: Completion(id=meta.id, created=meta.created, model=meta.model,
                                                    choices=answers, usage=usage),
            usage_chunk=(lambda usage: sse_data(Completion(id=meta.id, created=meta.created, model=meta.model,
                                                           choices=[], usage=usage))) if include_usage else None)

    counter = UsageCounter(reply_given=not scoring)
    record_tokens(request, counter.totals, lambda: counter.cached_tokens)
    echoes: list[str] = []
    prompts: list[list[int] | None] = []  # the prompt's tokens, where its log probabilities go with the echo

    async def submit_row() -> RowStream:
        prompt, prompt_text = await _prompt_tokens(state, engine, items[0], bool(data.echo), infill)
        counter.prompt_tokens = len(prompt)
        generation = row(prompt, 0)
        echoes.append(prompt_text if data.echo else "")
        prompts.append(prompt if generation.prompt_logprobs is not None else None)
        stream = submit(engine, generation, param="prompt")
        observe_queue_wait(state, timing)
        return stream

    return await respond(
        request, counter, timing, submit_row=submit_row,
        events=(lambda reader: _events(reader, meta, counter, include_usage, echoes[0], pieces, prompts[0], scoring,
                                       hidden)) if data.stream else None,
        collect=lambda stream: _collect(stream, meta, counter, echoes[0], timing, pieces, prompts[0], scoring, hidden),
        failure=lambda error: failed_end(error, _usage_chunk(meta, counter) if include_usage else b""))
