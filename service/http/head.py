"""HEAD on any GET route: answered as the GET would be, headers only (RFC 9110 §9.3.2: a general-purpose server
supports HEAD wherever it supports GET). Load balancers and uptime probes send HEAD /health."""

from __future__ import annotations

from typing import Any, cast

from litestar.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["HeadAsGet"]


class HeadAsGet:
    """ASGI wrapper: a HEAD request runs as GET below it and its body is not sent (Content-Length stays the GET's)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = cast(Message, {**cast(dict[str, Any], message), "body": b""})
            await send(message)

        inner = cast(Scope, {**scope, "method": "GET"})
        try:
            await self.app(inner, receive, headers_only)
        finally:
            if "path_template" in inner:  # the route it reached, for the access log's metrics label
                scope["path_template"] = inner["path_template"]
