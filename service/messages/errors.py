"""Errors in Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`, for the Messages routes.

`AnthropicErrors` wraps the app: every error answer under /v1/messages — the guard's (401, 503 while loading, 413),
Litestar's (400 for a body that is not valid, 404, 405) and the routes' — is rewritten from OpenAI's shape into
Anthropic's, its status and headers kept. The error's own code and field stay in the message (Anthropic's shape
has no field for them), and the access log, which this wraps, still sees the OpenAI body it reads codes from.
"""

from __future__ import annotations

import json
from typing import Any

from litestar.types import ASGIApp, Receive, Scope

from service.admin.anthropic_models import anthropic_models_request
from service.http.errors import APIError

__all__ = ["AnthropicErrors", "anthropic_error_body", "anthropic_type", "MESSAGES_PATH"]

MESSAGES_PATH = "/v1/messages"

# Anthropic's error types by status (its errors page); 503 (loading, restarting, draining) is its overloaded_error,
# kept at 503 with Retry-After, which the anthropic SDKs retry as they retry 529.
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
          504: "timeout_error", 529: "overloaded_error"}


def anthropic_type(status: int) -> str:
    """Anthropic's error type for an HTTP status. Raises nothing."""
    return _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def anthropic_error_body(error: APIError) -> dict[str, Any]:
    """`error` in Anthropic's shape. Raises nothing."""
    return {"type": "error", "error": {"type": anthropic_type(error.status), "message": error.message}}


def _rewritten(status: int, body: bytes) -> bytes | None:
    """An OpenAI-shaped error body in Anthropic's shape (None: not one). Raises nothing."""
    try:
        error = json.loads(body)["error"]
        message = str(error["message"])
    except (ValueError, KeyError, TypeError):
        return None
    return json.dumps({"type": "error", "error": {"type": anthropic_type(status), "message": message}}).encode()


class AnthropicErrors:
    """ASGI wrapper: error answers on /v1/messages in Anthropic's shape (module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        # /v1/models too when an Anthropic client asks (the anthropic SDKs' models.list and retrieve)
        if path != MESSAGES_PATH and not path.startswith(MESSAGES_PATH + "/") and not anthropic_models_request(scope):
            await self.app(scope, receive, send)
            return
        start: list[Any] = []  # the held response start (ASGI messages as plain dicts)
        chunks: list[bytes] = []

        async def rewriting(message: Any) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400 and _json(message):
                start.append(message)  # held until the body is whole (an error body is one small JSON object)
                return
            if not start or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = b"".join(chunks)
            status = start[0]["status"]
            new = _rewritten(status, body) or body
            headers = [(k, str(len(new)).encode() if k.lower() == b"content-length" else v)
                       for k, v in start[0].get("headers", [])]
            await send({**start[0], "headers": headers})
            await send({"type": "http.response.body", "body": new, "more_body": False})

        await self.app(scope, receive, rewriting)


def _json(start: Any) -> bool:
    return any(k.lower() == b"content-type" and v.startswith(b"application/json") for k, v in start.get("headers", []))
