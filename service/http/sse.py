"""Server-sent events: the one place events are framed (`data: ...\n\n`), and a streaming response that
always closes its generator. Frames built elsewhere around text (chat's chunks, the Responses and Messages events)
pass through `line_safe`.

The stream body is an async generator owning the engine row; whoever stops consuming it (end, error,
client disconnect, a client that stopped reading for the send timeout) must aclose it so its `finally` frees the
row at once, not whenever GC gets to it.
"""

from __future__ import annotations

import json
import logging
from typing import Any, AsyncGenerator, Awaitable, Callable

import anyio
from litestar import Request
from litestar.response import Stream
from litestar.response.base import ASGIResponse
from litestar.response.streaming import ASGIStreamingResponse
from pydantic import BaseModel

from service.http.errors import APIError, error_body
from service.state import scope_state

__all__ = ["DONE", "KEEPALIVE", "SSE_HEADERS", "line_safe", "sse_data", "null_usage", "sse_error", "EventSource",
           "SSEStream"]

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"  # an SSE comment: every client ignores it, every idle timer restarts

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# An HTTP/1.0 request's scope["http_version"]: "1.0" per ASGI, "1" from granian (2.8).
_HTTP_1_0 = ("1.0", "1")

_log = logging.getLogger("tandem.http")

# U+2028, U+2029 and U+0085 in UTF-8, and their JSON escapes: valid raw inside a JSON string, but str.splitlines()
# breaks lines at them (requests' iter_lines(decode_unicode=True)), cutting the event's JSON in two.
_LINE_BREAKS = ((b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"), (b"\xc2\x85", b"\\u0085"))


class ClientStalled(Exception):
    """The client read nothing of a stream for the send timeout (granian's send waits while its socket is full)."""


def line_safe(frame: bytes) -> bytes:
    """An event whose JSON is UTF-8 (`ensure_ascii=False`) with its U+2028, U+2029 and U+0085 escaped (see
    _LINE_BREAKS): they can only be inside its strings, where the escape means the same. Per token: a frame without
    them is returned as it is. Raises nothing."""
    if frame.isascii():  # most frames: one vectorised pass, where three substring searches cost ten times more
        return frame
    for raw, escaped in _LINE_BREAKS:
        if raw in frame:
            frame = frame.replace(raw, escaped)
    return frame


def sse_data(payload: BaseModel, *, exclude_none: bool = False) -> bytes:
    """One `data: <json>` event; `exclude_none`: without its None fields (those not asked for). Raises nothing for
    valid models."""
    return line_safe(b"data: " + payload.model_dump_json(exclude_none=exclude_none).encode() + b"\n\n")


def null_usage(event: bytes) -> bytes:
    """A `data: {...}` chunk with `"usage": null` last: with stream_options.include_usage OpenAI's chunks before
    the usage chunk carry it so. Raises nothing."""
    return event[:-3] + b',"usage":null}\n\n'


def sse_error(error: APIError) -> bytes:
    """The `data: {"error": ...}` event sent when a stream fails after its headers went out. Raises nothing."""
    return b"data: " + json.dumps(error_body(error)).encode() + b"\n\n"


class EventSource:
    """Async iterator of framed SSE events that owns a resource (the engine row) released by aclose().

    aclose() runs `on_close` even when the generator never started (client gone before the headers)."""

    def __init__(self, events: AsyncGenerator[bytes, None], on_close: Callable[[], Awaitable[None]] | None = None) -> None:
        self._events = events
        self._on_close = on_close

    def __aiter__(self) -> "EventSource":
        return self

    async def __anext__(self) -> bytes:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        """Close the generator, then release the resource. Raises what the generator's cleanup raises."""
        on_close, self._on_close = self._on_close, None
        try:
            await self._events.aclose()
        finally:
            if on_close is not None:
                with anyio.CancelScope(shield=True):
                    await on_close()


class _ClosingStreamingResponse(ASGIStreamingResponse):
    """Litestar's streaming response, but its iterator is aclosed however the response ends."""

    __slots__ = ()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        timeout = _send_timeout(scope)
        try:
            await super().__call__(scope, receive, _bounded(send, timeout) if timeout else send)
        except* ClientStalled as stalled:
            # Returning mid-body makes granian close the connection without the last chunk: the client, should it
            # read again, sees a cut response, never a whole one. The row is freed below (it generated unread).
            _log.warning("%s %s: %s", scope.get("method"), scope.get("path"), stalled.exceptions[0])
        finally:
            if (aclose := getattr(self.iterator, "aclose", None)) is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()


def _send_timeout(scope: Any) -> float | None:
    """The server's --send-timeout (None in an app without tandem's state). Raises nothing."""
    state = scope_state(scope)
    return state.config.limits.send_timeout if state is not None else None


def _bounded(send: Any, timeout: float) -> Any:
    """`send` that gives up after `timeout` seconds without the message going out: a client that stopped reading
    kept its row generating to max_tokens, its events piling up in the server."""

    async def bounded(message: Any) -> None:
        with anyio.move_on_after(timeout) as waited:
            await send(message)
        if waited.cancelled_caught:
            raise ClientStalled(f"the client read nothing for {timeout:g} s (--send-timeout): the stream was ended "
                                "and its generation stopped")

    return bounded


class SSEStream(Stream):
    """`text/event-stream` response over an async generator of already-framed events."""

    __slots__ = ()

    def __init__(self, events: EventSource | AsyncGenerator[bytes, None]) -> None:
        super().__init__(events, media_type="text/event-stream", headers=SSE_HEADERS, status_code=200)

    def to_asgi_response(self, app: Any, request: Request[Any, Any, Any], **kwargs: Any) -> ASGIResponse:
        """Build the ASGI response (Litestar API). Raises nothing."""
        if request.scope.get("http_version") in _HTTP_1_0:
            # HTTP/1.0 has no chunking: the body ends as the connection closes, so it must say so (RFC 9112 9.3),
            # or a keep-alive client (ab -k) sends its next request on the socket being closed.
            self.set_header("Connection", "close")
        response = super().to_asgi_response(app, request, **kwargs)
        # Same slots, one overridden method: swapping the class keeps every Litestar-computed field.
        response.__class__ = _ClosingStreamingResponse
        return response
