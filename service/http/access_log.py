"""One access-log line per HTTP request: method, path, status, duration, and tokens where a route knows
them (`record_tokens`). Wraps the whole app, so 404s and CORS preflights are logged too."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from litestar.connection import ASGIConnection
from litestar.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["AccessLog", "record_tokens", "ACCESS_LOGGER"]

ACCESS_LOGGER = "tandem.access"
# Where a route leaves a callable giving (prompt, completion) tokens; read once the response has ended.
_TOKENS_KEY = "tandem.tokens"

_log = logging.getLogger(ACCESS_LOGGER)


def record_tokens(connection: ASGIConnection[Any, Any, Any, Any], tokens: Callable[[], tuple[int, int]]) -> None:
    """Let the access log report this request's (prompt, completion) tokens, read after the response
    (a stream's last event) went out. Raises nothing."""
    connection.scope.setdefault("state", {})[_TOKENS_KEY] = tokens


class AccessLog:
    """ASGI wrapper logging each HTTP request once it has been answered (streams: once they end)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status: list[int] = []

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            _log.info("%s", _line(scope, status[0] if status else None, time.perf_counter() - start))


def _line(scope: Scope, status: int | None, seconds: float) -> str:
    path = scope.get("path", "")
    if query := scope.get("query_string", b""):
        path += "?" + query.decode("latin-1")
    line = f"{scope.get('method', '-')} {path} {status if status is not None else '-'} {seconds * 1000:.1f} ms"
    tokens = scope.get("state", {}).get(_TOKENS_KEY)
    if tokens is not None:
        try:
            prompt, completion = tokens()
            line += f" tokens {prompt}+{completion}"
        except Exception:  # noqa: BLE001 — the log line must never fail the request
            pass
    return line
