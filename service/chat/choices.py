"""Several choices in one request: `n` samples of a chat reply, or of each prompt of a text completion (a list of
prompts is lm-eval's batch), every choice its own engine row, so they run side by side in the batch. Non-streamed
the answers are gathered; streamed their chunks interleave as they come, each naming its `index` (prompt i's sample
j is choice i * n + j, as OpenAI numbers them). Usage counts each prompt once, however many samples it has."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, AsyncGenerator, Awaitable, Callable, Generic, TypeVar

import anyio
from anyio.abc import ObjectSendStream
from litestar import Request, Response
from pydantic import BaseModel

from engine.contracts import GenerationRequest, SamplingParams
from service.chat.replies import PromptTokensDetails, Usage
from service.chat.request_limits import MAX_CHOICES
from service.chat.request import submit
from service.chat.respond import FIRST_BYTE_WAIT, failed_end, keepalive_every
from service.chat.stream import RowReader, StreamTiming, UsageCounter, close_stream
from service.http.disconnect import ClientDisconnected, run_while_connected
from service.http.errors import APIError, in_band_error
from service.http.sse import DONE, KEEPALIVE, EventSource, SSEStream
from service.seams import ChatEngine, RowStream
from service.state import AppState

__all__ = ["Choice", "Choices", "respond_choices", "check_capacity", "prime", "PRIME_MIN_TOKENS"]

_log = logging.getLogger("tandem.service")

T = TypeVar("T")
A = TypeVar("A", bound=BaseModel)


@dataclass
class Choice(Generic[T]):
    """One choice's row, with what its route writes it from (`payload`: the echoed prompt of a completion, the
    translator of a chat reply)."""

    index: int
    first_sample: bool  # its prompt's tokens count in the usage (once per prompt)
    stream: RowStream
    timing: StreamTiming
    payload: T
    counter: UsageCounter = field(default_factory=UsageCounter)
    reader: RowReader = field(init=False)

    def __post_init__(self) -> None:
        self.reader = RowReader(self.stream, self.counter, self.timing)


class Choices(Generic[T]):
    """The request's choices, in submission order; `origin` is the key their rows share (GenerationRequest.origin)."""

    def __init__(self) -> None:
        self.all: list[Choice[T]] = []
        self.primed_writes = 0  # the prompt tokens its primers wrote into the prefix cache (prime)
        # One key for the request's rows: the engine's queue limit counts them as one request, not n.
        self.origin = uuid.uuid4().hex

    def totals(self) -> tuple[int, int]:
        """(prompt, completion) tokens so far, for the access log. Raises nothing."""
        usage = self.usage()
        return usage.prompt_tokens, usage.completion_tokens

    def usage(self) -> Usage:
        """Raises nothing."""
        prompt = sum(c.counter.prompt_tokens for c in self.all if c.first_sample)
        cached = sum(c.counter.cached_tokens for c in self.all if c.first_sample)
        # every row's: a sibling's put finds the tokens another stored first held already (each counted once)
        written = self.primed_writes + sum(c.counter.cache_write_tokens for c in self.all)
        completion = sum(c.counter.totals()[1] for c in self.all)
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=cached, cache_write_tokens=written))

    async def close(self) -> None:
        """Free every row (a finished one's close is a no-op). Raises nothing."""
        for choice in self.all:
            await close_stream(choice.stream)


# Shorter prompts: n prefills cost less than waiting for one before the rows start.
PRIME_MIN_TOKENS = 256


async def prime(engine: ChatEngine, generation: GenerationRequest, timing: StreamTiming, param: str) -> int:
    """Prefill `generation`'s prompt once before its `n` rows: a one-token greedy row whose KV the prefix cache keeps
    as it ends, so each sibling continues it instead of prefilling the whole prompt again (n = 8 of a 3,109-token
    prompt took 8.3× one). Skipped where the siblings would not use the cache (a seeded sampled row or a scored
    prompt prefills whole), for short prompts, and without a prefix cache. Returns the prompt tokens it wrote into the
    cache (the request's usage counts them: Choices.primed_writes). Raises APIError (queue full, the row failed, the
    deadline)."""
    if (len(generation.prompt_tokens) < PRIME_MIN_TOKENS or generation.prompt_logprobs is not None
            or (generation.sampling.seed is not None and generation.sampling.temperature > 0)
            or not (engine.stats().get("prefix_cache") or {}).get("max_bytes")):
        return 0
    first = replace(generation, max_tokens=1, sampling=SamplingParams(temperature=0.0), prompt_logprobs=None)
    counter = UsageCounter()
    reader = RowReader(submit(engine, first, param=param), counter, timing)
    async for _ in reader.items():  # the row closes as it ends, its KV going to the prefix cache
        pass
    return counter.cache_write_tokens


def check_capacity(state: AppState, n: int, prompts: int = 1) -> None:
    """Refuse more than MAX_CHOICES choices in one request (`prompts` × `n`), and choices this server could never
    hold at once (--max-active rows running, --max-queued waiting): a 429 would be retried for ever. Both name `n`
    where a request samples several choices a prompt (fewer samples is what fits), else `prompt`.
    Raises APIError 400."""
    count = prompts * n
    param = "n" if n > 1 else "prompt"
    # The count's own words: "n: 16 choices" of a request that asked for n = 4 read as a misparsed body.
    what = f"{prompts} prompts × n = {n}: {count} choices" if prompts > 1 and n > 1 else f"{count} choices"
    if count > MAX_CHOICES:
        raise APIError(400, f"{param}: {what} are more than one request may ask for ({MAX_CHOICES})", param=param,
                       code="invalid_value")
    room = state.config.max_active + state.config.queue_limit
    if count > room:
        raise APIError(400, f"{param}: {what} are more than this server runs and queues at once ({room}: "
                            f"--max-active {state.config.max_active} + --max-queued {state.config.queue_limit}); send "
                            f"fewer per request", param=param, code="too_many_choices")


async def respond_choices(request: Request[Any, Any, Any], state: AppState, choices: Choices[T], *,
                          submit_all: Callable[[Choices[T]], Awaitable[None]],
                          events_of: Callable[[Choice[T]], AsyncGenerator[bytes, None]] | None,
                          collect_of: Callable[[Choice[T]], Awaitable[A]],
                          whole: Callable[[list[A], Usage], Any],
                          usage_chunk: Callable[[Usage], bytes] | None) -> Response[Any]:
    """The body `whole(choices, usage)` (`events_of` None), or an SSE stream of the choices' chunks then
    `usage_chunk(usage)` when given, for the rows `submit_all` submits. Before the first byte a failure is a status
    code: a refused row's (every row is closed then), or a row failing before its first delta within
    FIRST_BYTE_WAIT; after it the usage chunk as far as the choices got (when given), an error event, then `[DONE]`.
    Raises APIError."""

    async def prepare() -> list[A] | None:
        try:
            await submit_all(choices)
            if events_of is None:
                return await _gather(choices, collect_of)
            began = time.monotonic()
            for choice in choices.all:
                await choice.reader.start(max(0.0, FIRST_BYTE_WAIT - (time.monotonic() - began)))
            return None
        except BaseException:
            await choices.close()
            raise

    try:
        answer = await run_while_connected(request, prepare)
    except ClientDisconnected:
        return Response(None, status_code=499)
    if answer is not None:
        return Response(whole(answer, choices.usage()))
    assert events_of is not None and state.task_group is not None  # the app's lifespan runs its task group
    return SSEStream(EventSource(_merged(state, choices, events_of, usage_chunk), choices.close))


async def _gather(choices: Choices[T], collect_of: Callable[[Choice[T]], Awaitable[A]]) -> list[A]:
    """Every choice collected side by side, in index order. Raises the first failure (the others are cancelled)."""
    out: list[A | None] = [None] * len(choices.all)
    failed: list[Exception] = []
    async with anyio.create_task_group() as group:
        async def one(position: int, choice: Choice[T]) -> None:
            try:
                out[position] = await collect_of(choice)
            except Exception as exc:  # kept, not raised: a task group would wrap it in an ExceptionGroup
                failed.append(exc)
                group.cancel_scope.cancel()

        for position, choice in enumerate(choices.all):
            group.start_soon(one, position, choice)
    if failed:
        raise failed[0]
    return [c for c in out if c is not None]  # submission order is index order


async def _merged(state: AppState, choices: Choices[T], events_of: Callable[[Choice[T]], AsyncGenerator[bytes, None]],
                  usage_chunk: Callable[[Usage], bytes] | None) -> AsyncGenerator[bytes, None]:
    """The choices' chunks as they come (keep-alives while none does), then the usage chunk when asked and `[DONE]`;
    a choice's failure ends the stream with an error event. Each choice is read by a task in the app's task group
    (not one inside this generator: a cancel scope must not span a yield)."""
    send, receive = anyio.create_memory_object_stream[bytes | Exception](64)
    assert state.task_group is not None
    for choice in choices.all:
        state.task_group.start_soon(_pump, choice, events_of, send.clone())
    send.close()
    every = keepalive_every(state)
    try:
        async with receive:
            while True:
                item: bytes | Exception | None = None
                with anyio.move_on_after(every):
                    try:
                        item = await receive.receive()
                    except anyio.EndOfStream:
                        break
                if item is None:
                    yield KEEPALIVE
                elif isinstance(item, Exception):
                    _log.warning("a stream of %d choices failed: %s", len(choices.all), item)
                    yield failed_end(in_band_error(item), usage_chunk(choices.usage()) if usage_chunk else b"")
                    return
                else:
                    yield item
        if usage_chunk is not None:
            yield usage_chunk(choices.usage())
        yield DONE
    finally:
        await choices.close()  # a client that left, or a failed choice: the others stop too


async def _pump(choice: Choice[T], events_of: Callable[[Choice[T]], AsyncGenerator[bytes, None]],
                send: ObjectSendStream[bytes | Exception]) -> None:
    """One choice's chunks into the merged stream, or its failure. Raises nothing: it runs in the app's task group,
    which an exception would end."""
    async with send:
        try:
            await choice.reader.start()  # no time limit: the merged stream sends the keep-alives
            events = events_of(choice)
            try:
                async for chunk in events:
                    await send.send(chunk)
            finally:
                await events.aclose()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # the stream ended (the client left, another choice failed)
        except Exception as exc:  # noqa: BLE001 — reported in the stream, never raised into the app
            try:
                await send.send(exc)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
