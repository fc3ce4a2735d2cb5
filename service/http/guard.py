"""The ASGI guard in front of Litestar: what every connection must pass before a route sees it.

In order: the Host name (a keyless loopback server's), the browser origin (and a CORS preflight's method), the API
key (every route but the health checks, websockets included), readiness (503 with Retry-After while the models load, the worker restarts or the server
drains; a CORS preflight is answered even then, or the page could not read the 503), then the body:
its size by route (413 from Content-Length, or as soon as a streamed body passes the limit; the rest of a refused
body is then read and dropped for a while, a lingering close) and its pace
(408 when no byte arrives for `body_timeout`, or the body averages under MIN_BODY_RATE past it). A websocket message
over `max_ws_frame_bytes` is dropped and handed on as a refusal the socket answers with an error event (the
connection and its session stay). Errors come out in OpenAI's shape.
"""

from __future__ import annotations

import json
import re
from typing import Any, cast

import anyio
from litestar.types import ASGIApp, Receive, Scope, Send

from service.http.auth import (CORS_METHODS, EXPOSED_HEADERS, KeyRing, header, host_allowed, origin_allowed,
                               set_client_key)
from service.http.errors import APIError, error_body, unavailable
from service.http.unacked_timeout import apply_user_timeout
from service.limits import Limits
from service.state import AppState

__all__ = ["Guard", "HEALTH_PATHS", "LIVENESS_PATH", "OPEN_PATHS", "ALWAYS_SERVED", "body_limit", "FRAME_REFUSED"]

# The health check's paths (/health's answer at each: vLLM's clients probe /ping, Kubernetes' /readyz), and the
# liveness check's, served without a key (a kubelet's probes send none).
HEALTH_PATHS = ("/health", "/v1/health", "/ping", "/readyz")
LIVENESS_PATH = "/livez"
OPEN_PATHS = frozenset((*HEALTH_PATHS, LIVENESS_PATH))
# Served while the models load or the server drains (everything else answers 503 then), so the health paths answer
# with their own body then. (/v1/models is not: while loading it would list nothing, and a client probing at startup
# would conclude the model is not served.)
ALWAYS_SERVED = (*OPEN_PATHS, "/stats", "/metrics", "/docs")

# Past the body timeout a body must have averaged this (Apache's mod_reqtimeout MinRate idea): a trickle of a byte
# every few seconds never trips the silence timeout, yet holds a connection and its buffer for good.
MIN_BODY_RATE = 1024

_SESSION_AUDIO = re.compile(r"^/v1/audio/sessions/[^/]+/audio/?$")


def body_limit(path: str, limits: Limits) -> int:
    """Largest request body `path` accepts: uploads and audio chunks have their own. Raises nothing."""
    if path.rstrip("/") in ("/v1/audio/transcriptions", "/v1/audio/translations"):
        return limits.max_upload_bytes
    if _SESSION_AUDIO.match(path):
        return limits.max_pcm_chunk_bytes
    return limits.max_body_bytes


class Guard:
    """ASGI wrapper applying auth, origin, readiness and body limits (module docstring)."""

    def __init__(self, app: ASGIApp, state: AppState) -> None:
        self.app = app
        self.state = state
        self._unacked_bounded = False  # the kernel drops connections whose client reads nothing (unacked_timeout.py)
        self.keys = KeyRing(state.config.api_keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if not self._unacked_bounded:
            # Once: the listening socket exists by the first request (granian builds it after the app starts).
            self._unacked_bounded = True
            apply_user_timeout(self.state.config.limits.send_timeout)
        self.state.inflight.enter()
        try:
            if kind == "http":
                await self._http(scope, receive, send)
            else:
                await self._websocket(scope, receive, send)
        finally:
            self.state.inflight.exit()

    def _refusal(self, scope: Scope) -> APIError | None:
        path = scope.get("path", "")
        config = self.state.config
        # granian hands a request without Host an empty one: as absent.
        if scope.get("http_version") == "1.1" and not header(scope, b"host"):
            return APIError(400, "An HTTP/1.1 request must carry a Host header (RFC 9112).", code="missing_host")
        if (hosts := sum(key.lower() == b"host" for key, _ in scope.get("headers", ()))) > 1:
            # Only the first is checked against the allowed names: a second could name any host.
            return APIError(400, f"A request carries one Host header (RFC 9112 section 3.2); this one has {hosts}.",
                            code="duplicate_host")
        if not host_allowed(scope, config.host, bool(self.keys), config.allowed_hosts):
            return APIError(403, f"Host {(header(scope, b'host') or '')[:100]!r} is not a name of this machine: a "
                                 "server listening on loopback without a key answers only those (start it with "
                                 "--allowed-hosts to add one, e.g. a reverse proxy's).", code="host_not_allowed")
        # An empty Origin names no page: as absent (an app that blanks its webview's origin sends one).
        origin = header(scope, b"origin") or None
        if origin is not None and not origin_allowed(origin, scope, self.state.config.allowed_origins):
            return APIError(403, f"Origin {origin} is not allowed (start the server with --allowed-origins).",
                            code="origin_not_allowed")
        # Litestar's CORS answers a method it does not allow with a plain-text 400: in OpenAI's shape here instead.
        method = header(scope, b"access-control-request-method")
        if origin is not None and _preflight(scope) and config.allowed_origins and method not in CORS_METHODS:
            return APIError(400, f"CORS preflight: the method {(method or '')[:40]!r} is not allowed (a page may use "
                                 f"{', '.join(CORS_METHODS)}).", code="cors_method_not_allowed")
        if self.keys and path not in OPEN_PATHS and not _preflight(scope):
            key_id = self.keys.match(scope)
            if key_id is None:
                how = ("Authorization: Bearer <key>, x-api-key, or from a browser the subprotocol "
                       "openai-insecure-api-key.<key> or a minted client secret") if scope["type"] == "websocket" \
                    else "Authorization: Bearer <key> or x-api-key"
                return APIError(401, f"Missing or incorrect API key (send {how}).",
                                code="invalid_api_key")
            set_client_key(scope, key_id)
        if not path.startswith(ALWAYS_SERVED) and not _preflight(scope):
            state = self.state
            if state.draining:
                return unavailable("The server is shutting down.", code="shutting_down")
            if not state.ready:
                return unavailable(f"The server is {state.phase}; retry shortly.", code=state.phase)
        return None

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        cors = self._cors_headers(scope)
        if (refusal := self._refusal(scope)) is not None:
            await _send_error(send, refusal, cors)
            return
        limit = body_limit(scope.get("path", ""), self.state.config.limits)
        length = header(scope, b"content-length")
        if length is not None and length.strip().isdigit() and int(length) > limit:
            await _send_error(send, _too_large(limit), cors)
            await linger(receive)
            return
        encoding = header(scope, b"content-encoding")
        if encoding is not None and encoding.strip().lower() not in ("", "identity"):
            await _send_error(send, APIError(415, f"Content-Encoding {encoding[:40]!r} is not supported: send the "
                                                  "body uncompressed.", code="unsupported_content_encoding",
                                             close=True), cors)
            await linger(receive)
            return
        reader = _BodyReader(receive, limit, self.state.config.limits.body_timeout)
        await self.app(scope, cast(Receive, reader), send)
        if reader.over_limit:  # answered 413 mid-body: the rest is still coming
            await linger(receive)

    def _cors_headers(self, scope: Scope) -> list[tuple[bytes, bytes]]:
        """What Litestar's CORS adds to its own responses, for the guard's: a browser reads an error (a 401, a 503
        while loading) only when it names the origin. Raises nothing."""
        origin = header(scope, b"origin")
        allowed = self.state.config.allowed_origins
        if not allowed or origin is None or not origin_allowed(origin, scope, allowed):
            return []
        return [(b"access-control-allow-origin", origin.encode("latin-1", "replace")), (b"vary", b"Origin"),
                (b"access-control-expose-headers", ", ".join(EXPOSED_HEADERS).encode())]

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self._refusal(scope)
        if refusal is None and scope.get("path") not in WEBSOCKET_PATHS:
            refusal = APIError(404, f"No websocket at {scope.get('path')!r}: live transcription is at "
                                    "/v1/realtime?intent=transcription and /v1/audio/live.", code="not_found")
        if refusal is not None:
            # Refused before the handshake completes: as an HTTP answer in OpenAI's error shape where the server
            # offers that (ASGI's websocket.http.response), else a close the client sees as HTTP 403.
            message = await receive()
            if message["type"] != "websocket.connect":
                return
            if "websocket.http.response" in (scope.get("extensions") or {}):
                await _send_error(send, refusal, websocket=True)
            else:
                await send({"type": "websocket.close", "code": 1008, "reason": refusal.message[:120]})
            return
        frames = _FrameLimit(receive, self.state.config.limits.max_ws_frame_bytes)
        await self.app(scope, cast(Receive, frames.receive), send)


# The routes that take a websocket (service/speech/live.py); an upgrade anywhere else is a 404, not a bare 403.
WEBSOCKET_PATHS = frozenset({"/v1/realtime", "/v1/audio/live"})


def _preflight(scope: Scope) -> bool:
    # Browsers send CORS preflights without credentials; CORS (when configured) answers them.
    return scope.get("method") == "OPTIONS" and header(scope, b"access-control-request-method") is not None


# nginx's lingering_time and lingering_timeout: how long a refused body is read and dropped before the connection
# closes.
LINGER_S, LINGER_IDLE_S = 30.0, 5.0


async def linger(receive: Receive) -> None:
    """Read and drop the rest of a body refused before it was read (RFC 9112 §9.6, nginx's lingering close): a
    client that writes its whole body before reading (Node's fetch, so openai-node and gateways) got EPIPE instead
    of the 413 when the connection closed under its upload. Ends when the body does, the client leaves,
    LINGER_IDLE_S pass with no bytes or LINGER_S in all. Raises nothing."""
    with anyio.move_on_after(LINGER_S):
        while True:
            with anyio.move_on_after(LINGER_IDLE_S) as waited:
                message = await receive()
            if waited.cancelled_caught or message["type"] != "http.request" or not message.get("more_body", False):
                return


def _too_large(limit: int) -> APIError:
    return APIError(413, f"The request body is larger than this route's limit of {limit} bytes.",
                    code="request_too_large", close=True)


async def _send_error(send: Any, error: APIError, extra: list[tuple[bytes, bytes]] | None = None, *,
                      websocket: bool = False) -> None:
    body = json.dumps(error_body(error)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(extra or [])]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    if error.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    kind = "websocket.http.response" if websocket else "http.response"
    await send({"type": f"{kind}.start", "status": error.status, "headers": headers})
    await send({"type": f"{kind}.body", "body": body})


class _BodyReader:
    """receive() that counts body bytes against the limit and bounds the wait for each body message, and the
    body as a whole: past `timeout` it must have kept MIN_BODY_RATE on average (one byte every 29 s once held a
    request open for good). Raises APIError 413 / 408 into whichever route is reading the body (its handlers
    answer them)."""

    def __init__(self, receive: Any, limit: int, timeout: float) -> None:
        self._receive = receive
        self._limit = limit
        self._timeout = timeout
        self._seen = 0
        self._complete = False
        self._start = anyio.current_time()
        self.over_limit = False  # refused with a 413 before the body ended

    async def __call__(self) -> Any:
        if self._complete:
            return await self._receive()  # after the body: only the disconnect is left, however late
        deadline = self._start + self._timeout + self._seen / MIN_BODY_RATE
        wait = min(self._timeout, deadline - anyio.current_time())
        with anyio.move_on_after(max(0.0, wait)):
            message = await self._receive()
            if message["type"] == "http.request":
                self._seen += len(message.get("body", b""))
                if self._seen > self._limit:
                    self.over_limit = not self._complete and bool(message.get("more_body", False))
                    raise _too_large(self._limit)
                self._complete = not message.get("more_body", False)
            else:
                self._complete = True
                if message["type"] == "http.disconnect":  # its chunked framing broke (or the client left mid-body)
                    raise APIError(400, "The request body ended before it was complete (its chunked encoding was "
                                        "malformed, or the connection closed).", code="incomplete_body", close=True)
            return message
        if self._seen and wait < self._timeout:
            raise APIError(408, f"The request body arrived slower than {MIN_BODY_RATE} bytes/s on average.",
                           code="body_too_slow", close=True)
        raise APIError(408, f"No request body bytes arrived for {self._timeout:g} s.", code="body_timeout", close=True)


# The key of a `websocket.receive` message _FrameLimit refused: its APIError (the message's data is gone).
FRAME_REFUSED = "tandem.frame_refused"


class _FrameLimit:
    """Websocket messages above `limit` bytes: dropped, their bytes freed before anything decodes them, and
    handed to the app as a `websocket.receive` without data carrying the error under FRAME_REFUSED. The socket
    answers it in turn, as any bad message, and goes on (service/speech/live_socket.py): closing lost the
    session and its audio. The one size rule for a message, in its bytes; a single frame over granian's 16 MiB
    never gets here (service/server.py GRANIAN_WS_FRAME_BYTES), so the default limit is exactly that."""

    def __init__(self, receive: Any, limit: int) -> None:
        self._receive = receive
        self._limit = limit

    async def receive(self) -> Any:
        message = await self._receive()
        if message["type"] == "websocket.receive":
            text = message.get("text") or ""
            # isascii() is a flag check: a JSON append is ASCII, so its size needs no encoded copy
            size = len(message.get("bytes") or b"") + (len(text) if text.isascii() else len(text.encode()))
            if size > self._limit:
                err = APIError(400, f"A websocket message of {size} bytes is over the limit of {self._limit} bytes; "
                                    "it was dropped (send the audio in smaller appends).", code="message_too_large")
                return {"type": "websocket.receive", "bytes": None, "text": None, FRAME_REFUSED: err}
        return message
