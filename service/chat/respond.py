"""How chat and text completions answer once their row is submitted: an SSE stream (only after the row's
first delta, so a row that fails first is a 5xx, never an empty 200) or the collected JSON body; 499 with no
body for a client that left first."""

from __future__ import annotations

from typing import Any, AsyncGenerator, Awaitable, Callable

from litestar import Request, Response

from service.chat.stream import RowReader, UsageCounter, close_stream
from service.http.disconnect import ClientDisconnected, run_while_connected
from service.http.sse import EventSource, SSEStream
from service.seams import RowStream

__all__ = ["respond"]


async def respond(request: Request[Any, Any, Any], stream: RowStream, counter: UsageCounter, *,
                  events: Callable[[RowReader], AsyncGenerator[bytes, None]] | None,
                  collect: Callable[[], Awaitable[Any]]) -> Response[Any]:
    """SSE from `events(reader)` when given, else the body `collect()` builds. Raises APIError (the row's
    failure before its first delta, or while collecting)."""
    try:
        if events is not None:
            reader = RowReader(stream, counter)
            await run_while_connected(request, reader.start)
            # stream=true answers with SSE instead of the JSON body (documented by sse_operation).
            return SSEStream(EventSource(events(reader), lambda: close_stream(stream)))
        return Response(await run_while_connected(request, collect))
    except ClientDisconnected:
        return Response(None, status_code=499)
