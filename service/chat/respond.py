"""How chat and text completions answer: everything before the first header — the prompt's rendering, the
engine's queue, and the row's first delta (streaming) or its whole reply — runs under one disconnect
watcher, so a client that leaves stops it wherever it is. Then an SSE stream (after the first delta, so a row
that fails first is a 5xx, never an empty 200; or, when the first delta is slow — a queue, a long prompt — after
FIRST_BYTE_WAIT with SSE comments every --sse-keepalive seconds until it comes, a failure then in-band, and as often
while the stream is quiet after it) or the collected JSON body; 499 with no body for a client that left first."""

from __future__ import annotations

import logging
from contextlib import aclosing
from typing import Any, AsyncGenerator, Awaitable, Callable

from anyio.abc import TaskGroup
from litestar import Request, Response

from engine.errors import EngineError
from service.chat.stream import RowReader, StreamTiming, UsageCounter
from service.http.disconnect import ClientDisconnected, run_while_connected
from service.http.errors import APIError, in_band_error
from service.http.idle_keepalive import kept_alive_while_idle
from service.http.sse import DONE, KEEPALIVE, EventSource, SSEStream, sse_error
from service.seams import RowStream
from service.state import AppState, get_state

__all__ = ["FIRST_BYTE_WAIT", "keepalive_every", "failed_end", "respond"]

_log = logging.getLogger("tandem.service")

# A stream's headers wait this long for its first delta (a failure until then is a status code). Nothing sent for
# longer, clients with read timeouts (httpx's default is 5 s) and proxies' idle timeouts cut a queued stream.
FIRST_BYTE_WAIT = 2.0


def keepalive_every(state: AppState) -> float | None:
    """Seconds between keep-alives while a stream sends nothing (--sse-keepalive), None when they are off.
    Raises nothing."""
    return state.config.sse_keepalive or None


def failed_end(error: APIError, usage_chunk: bytes = b"") -> bytes:
    """How a chat or text completion stream that failed after its headers ends: `usage_chunk` (the usage chunk, usage
    as far as the reply got, where stream_options.include_usage asked: clients meter streams by it), the error event,
    `[DONE]`. Raises nothing."""
    return usage_chunk + sse_error(error) + DONE


async def respond(request: Request[Any, Any, Any], counter: UsageCounter, timing: StreamTiming, *,
                  submit_row: Callable[[], Awaitable[RowStream]],
                  events: Callable[[RowReader], AsyncGenerator[bytes, None]] | None,
                  collect: Callable[[RowStream], Awaitable[Any]],
                  keepalive: Callable[[], bytes] = lambda: KEEPALIVE,
                  failure: Callable[[APIError], bytes] = failed_end, may_go_quiet: bool = False) -> Response[Any]:
    """SSE from `events(reader)` when given, else the body `collect(row)` builds, for the row `submit_row()`
    renders and submits; `keepalive()` is sent while the first delta is awaited after the headers (and whenever the
stream is quiet after it when `may_go_quiet`: a reply that holds text back), `failure(error)`
    ends a stream that fails then (chat's: failed_end). Raises APIError (what
    rendering or the engine refuses, the row's failure before its first delta or while collecting, 504 past the
    deadline). The row is closed by its reader however this ends (RowReader.start / items)."""
    async def prepare() -> Any:
        row = await submit_row()
        if events is None:
            return await collect(row)
        reader = RowReader(row, counter, timing)
        await reader.start(FIRST_BYTE_WAIT)
        return reader

    try:
        answer = await run_while_connected(request, prepare)
    except ClientDisconnected:
        return Response(None, status_code=499)
    if isinstance(answer, RowReader) and events is not None:
        # stream=true answers with SSE instead of the JSON body (documented by sse_operation).
        state = get_state(request)
        every = keepalive_every(state)
        # Reading the events through a task costs ~15 µs a token (a hand-off each), so only replies that can hold
        # text back for long (tool calls that come whole, thinking not shown) pay it.
        task_group = state.task_group if may_go_quiet else None
        return SSEStream(EventSource(_kept_alive(answer, events, keepalive, every, failure, task_group),
                                     answer.leave))
    return Response(answer)


async def _kept_alive(reader: RowReader, events: Callable[[RowReader], AsyncGenerator[bytes, None]],
                      keepalive: Callable[[], bytes], every: float | None, failure: Callable[[APIError], bytes],
                      task_group: TaskGroup | None) -> AsyncGenerator[bytes, None]:
    """Keep-alives every `every` seconds (None: none) until the row's first delta (at once when it came before the
    headers), then its events, with a keep-alive whenever none went out for `every` seconds (read by a task in the
    app's `task_group`; without one, an app with no lifespan, none); a failure or the deadline before the first delta
    ends the stream in-band."""
    try:
        while not await reader.start(every):
            yield keepalive()
    except Exception as exc:  # noqa: BLE001 — the headers (and keep-alives) are out: whatever the row raised, an
        # engine process's death's EngineRestarting (meant as a 503) too, ends the stream with the route's error event
        error = in_band_error(exc)
        _log.warning("stream failed before its first token (%d %s): %s", error.status, error.code, exc,
                     exc_info=None if isinstance(exc, (APIError, EngineError)) else exc)
        yield failure(error)
        return
    said = events(reader)
    if every is not None and task_group is not None:
        said = kept_alive_while_idle(said, keepalive, every, task_group)
    async with aclosing(said) as stream:
        async for event in stream:
            yield event
