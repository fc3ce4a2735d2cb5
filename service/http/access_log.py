"""One access-log line per HTTP request: method, path, status, duration, and tokens where a route knows
them (`record_tokens`); the same request counted in the metrics by route template, with its usage and, for a stream
that failed after its headers, its error's code. Wraps the whole app,
so 404s, CORS preflights and the guard's refusals are logged and counted too, and each gets an
`x-request-id` header (the openai SDKs read it into `_request_id`): the client's own when it sent a sane one, as vLLM
echoes it, else a fresh one. A websocket gets its line when it ends. Behind a reverse proxy listed in
--forwarded-allow-ips, the client is the one its X-Forwarded-For names (service/http/forwarded.py)."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from urllib.parse import quote
from typing import Any, Callable, Protocol

from litestar.connection import ASGIConnection
from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send

from service.http.auth import header
from service.http.forwarded import TrustedProxies
from service.http.retry_after import RecentDurations

__all__ = ["AccessLog", "RequestMetrics", "record_tokens", "record_user", "record_metadata", "arrival_time",
           "ACCESS_LOGGER"]

ACCESS_LOGGER = "tandem.access"
# Where a route leaves a callable giving (prompt, completion) tokens; read once the response has ended.
_TOKENS_KEY = "tandem.tokens"
# Where it leaves one giving the prompt tokens served from the prefix cache (the usage's cached_tokens).
_CACHED_KEY = "tandem.cached_tokens"
# The end user a request names (OpenAI's `user` / `safety_identifier`), for abuse monitoring.
_USER_KEY = "tandem.user"
# What the line writes of it (OpenAI caps safety_identifier at 64): the API takes any length, the log stays bounded.
_USER_CHARS = 64
# A request's tags (OpenAI's `metadata`), as the line writes them.
_METADATA_KEY = "tandem.metadata"
# What the line writes of them, counted as written (JSON escapes a non-ASCII character in 6 or 12): OpenAI's limits
# (16 pairs, 64-character keys, 512-character values) let 16 pairs of emoji make a 110 kB line.
_TAG_CHARS = 64  # of each key and value
_METADATA_CHARS = 1024  # of the whole object
# When the request arrived (time.monotonic()): deadlines and time-to-first-token count from here.
_ARRIVAL_KEY = "tandem.arrival"
# A client's X-Request-Id taken as this request's: printable ASCII without spaces (one word of the log line, a valid
# header value), at most 128 characters.
_CLIENT_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")

_log = logging.getLogger(ACCESS_LOGGER)


def record_tokens(connection: ASGIConnection[Any, Any, Any, Any], tokens: Callable[[], tuple[int, int]],
                  cached: Callable[[], int] | None = None) -> None:
    """Let the access log report this request's (prompt, completion) tokens, and the metrics count them with the
    `cached` prompt tokens, read after the response (a stream's last event) went out. Raises nothing."""
    state = connection.scope.setdefault("state", {})
    state[_TOKENS_KEY] = tokens
    if cached is not None:
        state[_CACHED_KEY] = cached


def record_user(connection: ASGIConnection[Any, Any, Any, Any], user: str | None) -> None:
    """Write `user` (an end-user id the client sent) on this request's log line, its first _USER_CHARS characters
    and a mark where it was longer. Raises nothing."""
    if user:
        connection.scope.setdefault("state", {})[_USER_KEY] = user[:_USER_CHARS + 1]


def record_metadata(connection: ASGIConnection[Any, Any, Any, Any], metadata: dict[str, str] | None) -> None:
    """Write `metadata` (a client's tags, within OpenAI's limits) on this request's log line as one JSON object, each
    key and value cut to _TAG_CHARS written characters and the object to _METADATA_CHARS, `...` marking a cut.
    Raises nothing."""
    if metadata:
        connection.scope.setdefault("state", {})[_METADATA_KEY] = _written_metadata(metadata)


def _written_metadata(metadata: dict[str, str]) -> str:
    """`{"key":"value",...}` as the line writes it: `"text"...` a cut key or value, `,...}` pairs left out (the
    object would pass _METADATA_CHARS). Raises nothing."""
    written = ""
    for key, value in metadata.items():
        pair = f"{_quoted(key, _TAG_CHARS)}:{_quoted(value, _TAG_CHARS)}"
        if 1 + len(written) + len(pair) + len(",...}") > _METADATA_CHARS:
            return "{" + written + (",...}" if written else "...}")
        written += f",{pair}" if written else pair
    return "{" + written + "}"


def _quoted(text: str, limit: int) -> str:
    """`text` as a JSON string (ASCII: one line) of at most `limit` characters between its quotes, cut before the
    escape that would pass it, `...` after the closing quote where it was cut. Raises nothing."""
    pieces: list[str] = []
    size = 0
    for char in text[:limit + 1]:  # each character writes at least one
        piece = json.dumps(char, ensure_ascii=True)[1:-1]
        if size + len(piece) > limit:
            return '"' + "".join(pieces) + '"...'
        pieces.append(piece)
        size += len(piece)
    return '"' + "".join(pieces) + '"'


def arrival_time(connection: ASGIConnection[Any, Any, Any, Any]) -> float:
    """time.monotonic() when the request arrived (now, for a connection the access log never saw).
    Raises nothing."""
    value = connection.scope.get("state", {}).get(_ARRIVAL_KEY)
    return value if isinstance(value, float) else time.monotonic()


class RequestMetrics(Protocol):
    def observe_request(self, route: str, method: str, status: int | None, seconds: float) -> None: ...

    def observe_session(self, route: str, status: int | None, seconds: float) -> None: ...

    def observe_usage(self, route: str, prompt: int, completion: int, cached: int) -> None: ...

    def observe_stream_failure(self, route: str, code: str) -> None: ...


class AccessLog:
    """ASGI wrapper logging (and counting) each HTTP request once it has been answered (streams: once
    they end)."""

    def __init__(self, app: ASGIApp, metrics: RequestMetrics | None = None, paths: frozenset[str] = frozenset(),
                 proxies: TrustedProxies | None = None, durations: RecentDurations | None = None) -> None:
        self.app = app
        self.metrics = metrics
        # Where a generation request answered whole adds its duration (a queue_full's Retry-After reads them).
        self.durations = durations
        # The app's fixed paths: a request the guard refused before routing is still counted under its route.
        self.paths = paths
        # Peers whose X-Forwarded-For names the client on the line (--forwarded-allow-ips).
        self.proxies = proxies or TrustedProxies()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._socket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        scope.setdefault("state", {})[_ARRIVAL_KEY] = time.monotonic()
        request_id = _request_id(scope)
        id_header = (b"x-request-id", request_id.encode())
        status: list[int] = []
        ended: list[bool] = []  # the response's last body message went out
        left: list[bool] = []  # the server saw the client disconnect
        refusal: list[str] = []  # an error answer's code and field: why, for the operator
        failed: list[str] = []  # the code of the error event ending a stream after its 200

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
                message = {**message, "headers": [*message.get("headers", ()), id_header]}
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                if not message.get("more_body", False):
                    ended.append(True)
                    if status and status[0] >= 400 and not refusal:
                        refusal.append(_refusal(body))
                # A stream that failed after its 200: its error event's code ("error" quoted is only ever a key).
                if status and status[0] < 400 and not refusal and b'"error"' in body:
                    if error := _event_error(body):
                        refusal.append(_described(error))
                        failed.append(_code_label(error))
            await send(message)

        async def listen() -> ReceiveMessage:
            message = await receive()
            if message["type"] == "http.disconnect":
                left.append(True)
            return message

        try:
            await self.app(scope, listen, watch)
        finally:
            seconds = time.perf_counter() - start
            code = status[0] if status else None
            client = self._client(scope)
            fields = _fields(scope, code, seconds, request_id, client)
            line = _line(scope, fields)
            if refusal and refusal[0]:
                line += f" error {refusal[0]}"
                fields["error"] = refusal[0]
            if status and not ended:  # a 200 whose stream was cut short must not read as a whole answer
                line += " incomplete: the client left" if left else " incomplete"
                fields["incomplete"] = "client_left" if left else "incomplete"
            # The id the client got (x-request-id, the SDKs' `_request_id`) and its address: a report finds its line.
            _log.info("%s %s from %s", line, request_id, client, extra=fields)
            if self.durations is not None and code is not None and code < 400 and "prompt_tokens" in fields \
                    and ended and not failed:  # a generation that ran to its end
                self.durations.add(seconds)
            if self.metrics is not None:
                # The route template, not the path: session ids and model ids must not become labels.
                route = str(scope.get("path_template") or self._route(scope, code))
                self.metrics.observe_request(route, _method_label(scope.get("method")), code, seconds)
                if failed:
                    self.metrics.observe_stream_failure(route, failed[0])
                if code is not None and code < 400 and "prompt_tokens" in fields:  # an error status gave no usage
                    self.metrics.observe_usage(route, fields["prompt_tokens"], fields["completion_tokens"],
                                               _cached(scope, fields["prompt_tokens"]))


    async def _socket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One line when a websocket ends: 101 (accepted) or 403 (refused at the handshake, and why: the client
        sees no reason), how long it lasted and who closed it (the server's close code). Counted once in the metrics
        as it ends, its length apart from the request durations (a session's, not a response's). Its id and client end
        the line as an HTTP request's do."""
        start = time.perf_counter()
        request_id = _request_id(scope)
        status: list[int] = []
        closed: list[int] = []
        reasons: list[str] = []

        async def watch(message: Message) -> None:
            if message["type"] == "websocket.accept":
                status.append(101)
            elif message["type"] == "websocket.close":
                closed.append(int(message.get("code", 1000)))
                reasons.append(str(message.get("reason") or ""))
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            code = status[0] if status else 403 if closed else None
            seconds = time.perf_counter() - start
            client = self._client(scope)
            fields = _fields(scope, code, seconds, request_id, client, method="WS")
            line = _line(scope, fields)
            end = "refused" if not status else f"closed {closed[0]}" if closed else "closed by the client"
            if not status and reasons and reasons[0]:  # quoted: an Origin or Host header's text may be in it
                end += f": {json.dumps(reasons[0], ensure_ascii=True)}"
            _log.info("%s %s %s from %s", line, end, request_id, client, extra={**fields, "end": end})
            if self.metrics is not None:
                route = scope.get("path_template") or ("unrouted" if code is None or code == 403
                                                       else self._route(scope, code))
                self.metrics.observe_session(str(route), code, seconds)

    def _client(self, scope: Scope) -> str:
        """The client's address; behind a trusted proxy the one its X-Forwarded-For names, and the proxy's
        (`203.0.113.7 via 127.0.0.1`). Raises nothing."""
        client, proxy = self.proxies.client(scope)
        return client if proxy is None else f"{client} via {proxy}"

    def _route(self, scope: Scope, code: int | None) -> str:
        """The label of a request no route took: its path where that is one of the app's, else "unrouted" (a 404)
        or "guard" (refused before routing). Raises nothing."""
        path = scope.get("path", "")
        if path in self.paths:
            return str(path)
        return "unrouted" if code == 404 else "guard"


# The methods a metrics label names; any other is "other": a client inventing methods must not create series.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _request_id(scope: Scope) -> str:
    """The client's X-Request-Id when it is sane (vLLM echoes it; `vllm bench serve` sends one a request, so its
    requests are found in the log by its ids), else a fresh one, as OpenAI's. Raises nothing."""
    sent = header(scope, b"x-request-id")
    return sent if sent is not None and _CLIENT_REQUEST_ID.fullmatch(sent) else f"req_{uuid.uuid4().hex}"


def _method_label(method: Any) -> str:
    return method if method in _METHODS else "other"


def _event_error(body: Any) -> dict[str, Any] | None:
    """The error object of the first SSE event in `body` that carries one (chat's and completions'
    `data: {"error": ...}`, the Responses API's and the Messages API's `error` events), None when none does. Raises
    nothing."""
    if not isinstance(body, (bytes, bytearray)) or len(body) > 65536:
        return None
    for line in bytes(body).split(b"\n"):
        if line.startswith(b"data: {") and b'"error"' in line:
            try:
                payload = json.loads(line[6:])
            except ValueError:
                continue
            if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
                return payload["error"]
    return None


def _code_label(error: dict[str, Any]) -> str:
    """An error's code (else its type: Anthropic's errors have no code) as a metrics label: the server's own words, a
    fixed set; anything else "other", so no series is made from a client's text. Raises nothing."""
    code = error.get("code") or error.get("type")
    return code if isinstance(code, str) and re.fullmatch(r"[a-z_]{1,40}", code) else "other"


def _cached(scope: Scope, prompt: int) -> int:
    """The prompt tokens of a request's usage served from the prefix cache, where its route recorded them (the usage
    as far as it got: a stream failed or left after its headers). Raises nothing."""
    cached = scope.get("state", {}).get(_CACHED_KEY)
    try:
        return min(cached(), prompt) if cached is not None else 0
    except Exception:  # noqa: BLE001 — the metrics must never fail the request
        return 0


def _refusal(body: Any) -> str:
    """`code (param)` of an OpenAI-shaped error body (its code, else its type), "" for any other. Raises nothing."""
    if not isinstance(body, (bytes, bytearray)) or len(body) > 65536 or not body.startswith(b'{"error"'):
        return ""
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return ""
    return _described(error) if isinstance(error, dict) else ""


def _described(error: dict[str, Any]) -> str:
    """`code (param)` of an error object. Raises nothing."""
    what = str(error.get("code") or error.get("type") or "")
    param = error.get("param")
    # Codes and fields are the server's words, but a field can echo a client's key: quoted where not plain.
    what = what if re.fullmatch(r"[\w.\-]{1,64}", what) else json.dumps(what[:64], ensure_ascii=True)
    if isinstance(param, str) and param:
        what += f" ({param})" if re.fullmatch(r"[\w.\[\]\-]{1,120}", param) else \
            f" ({json.dumps(param[:120], ensure_ascii=True)})"
    return what


def _fields(scope: Scope, status: int | None, seconds: float, request_id: str, client: str,
            method: str | None = None) -> dict[str, Any]:
    """The line's parts as a record's extra fields: keys of its JSON line under --log-format json, and what the text
    line (`_line`) and the usage metrics read; the route's tokens read once. Raises nothing."""
    fields: dict[str, Any] = {"method": method or scope.get("method", "-"), "path": scope.get("path", ""),
                              "status": status, "duration_ms": round(seconds * 1000, 1), "request_id": request_id,
                              "client": client}
    if query := scope.get("query_string", b""):
        fields["query"] = query.decode("latin-1")
    tokens = scope.get("state", {}).get(_TOKENS_KEY)
    if tokens is not None:
        try:
            fields["prompt_tokens"], fields["completion_tokens"] = tokens()
        except Exception:  # noqa: BLE001 — the log line must never fail the request
            pass
    if (user := scope.get("state", {}).get(_USER_KEY)) is not None:
        fields["user"] = user[:_USER_CHARS]
    return fields


def _line(scope: Scope, fields: dict[str, Any]) -> str:
    """The text line of `fields` (`_fields`), up to its error and request id. Raises nothing."""
    # As sent (percent-encoded): a decoded path could carry a newline and forge a line of its own.
    path = quote(scope.get("path", ""), safe="/:@!$&'()*+,;=~")
    if query := scope.get("query_string", b""):
        path += "?" + quote(query.decode("latin-1"), safe="/:@!$&'()*+,;=~?%")
    status = fields["status"]
    line = f"{fields['method']} {path} {status if status is not None else '-'} {fields['duration_ms']:.1f} ms"
    if "prompt_tokens" in fields:
        line += f" tokens {fields['prompt_tokens']}+{fields['completion_tokens']}"
    if (user := scope.get("state", {}).get(_USER_KEY)) is not None:
        # Quoted and escaped: a client's text on one line; "..." after the quote: it was cut.
        line += f" user {json.dumps(user[:_USER_CHARS], ensure_ascii=True)}{'...' if len(user) > _USER_CHARS else ''}"
    if isinstance(metadata := scope.get("state", {}).get(_METADATA_KEY), str):
        line += f" metadata {metadata}"
    return line
