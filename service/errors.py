"""Errors in OpenAI's shape `{"error": {"message", "type", "param", "code"}}` and the Litestar handlers
that turn every failure — including Litestar's own 400/404/405 and unexpected exceptions — into it."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, SerializationException, ValidationException

__all__ = [
    "APIError",
    "error_body",
    "error_response",
    "model_not_found",
    "context_length_exceeded",
    "sse_error_event",
    "EXCEPTION_HANDLERS",
]

_log = logging.getLogger("tandem.service")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
}


class APIError(Exception):
    """An error a route raises on purpose; rendered as-is in OpenAI's shape."""

    def __init__(
        self, status: int, message: str, *, type: str | None = None, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.param = param
        self.code = code


def model_not_found(model: str, available: list[str]) -> APIError:
    """404 for a model this server does not serve. Raises nothing."""
    served = ", ".join(available) or "none"
    return APIError(
        404,
        f"The model `{model}` does not exist or is not served here (served: {served}).",
        param="model",
        code="model_not_found",
    )


def context_length_exceeded(detail: str, param: str = "messages") -> APIError:
    """400 for a prompt that cannot fit the model's context. Raises nothing."""
    return APIError(400, detail, param=param, code="context_length_exceeded")


def error_body(error: APIError) -> dict[str, Any]:
    """The JSON body for an error. Raises nothing."""
    return {"error": {"message": error.message, "type": error.type, "param": error.param, "code": error.code}}


def error_response(error: APIError) -> Response[dict[str, Any]]:
    """A Litestar response for an error. Raises nothing."""
    return Response(error_body(error), status_code=error.status, media_type="application/json")


def sse_error_event(message: str, *, type: str = "server_error", code: str | None = None) -> bytes:
    """The `data: {"error": ...}` event sent when a stream fails after its headers went out. Raises nothing."""
    body = {"error": {"message": message, "type": type, "param": None, "code": code}}
    return f"data: {json.dumps(body)}\n\n".encode()


# pydantic puts union members and validator kinds into error locations ("content.str",
# "content.list[TextPart].0.text"); field names here are snake_case, so anything else is a tag.
_LOC_TAG = re.compile(r"^(str|int|float|bool|none|.*\[.*\].*|[A-Z]\w*)$")


def _field_path(key: Any) -> str | None:
    if key in (None, ""):
        return None
    parts = [part for part in str(key).split(".") if not _LOC_TAG.match(part)]
    return ".".join(parts) or None


def _validation_error(exc: ValidationException) -> APIError:
    # Litestar's pydantic plugin reports [{"message", "key"}]; key is the dotted field path.
    extra = exc.extra if isinstance(exc.extra, list) else []
    if not extra:
        return APIError(400, "Request body must be a JSON object.", code="invalid_request_body")
    problems = [e if isinstance(e, dict) else {"message": str(e)} for e in extra]
    # For a union (content: str | parts) the deepest location says what was actually wrong.
    first = max(problems, key=lambda e: len((_field_path(e.get("key")) or "").split(".")))
    message = str(first.get("message", exc.detail)).removeprefix("Value error, ")
    param = _field_path(first.get("key"))
    others = {_field_path(e.get("key")) for e in problems} - {param}
    more = f" (and {len(others)} more fields)" if others else ""
    text = f"{param}: {message}{more}" if param else f"{message}{more}"
    return APIError(400, text, param=param, code="invalid_value")


def _http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[dict[str, Any]]:
    if isinstance(exc, ValidationException):
        return error_response(_validation_error(exc))
    status = exc.status_code
    detail = str(exc.detail)
    if status == 400 and (isinstance(exc.__cause__, SerializationException) or "JSON" in detail):
        return error_response(APIError(400, f"We could not parse the JSON body of your request: {detail}", code="invalid_json"))
    if status == 404:
        return error_response(APIError(404, f"Invalid URL ({request.method} {request.url.path})", code="not_found"))
    if status == 405:
        return error_response(
            APIError(405, f"Method {request.method} is not allowed on {request.url.path}", code="method_not_allowed")
        )
    return error_response(APIError(status, detail))


def _api_error(_: Request[Any, Any, Any], exc: APIError) -> Response[dict[str, Any]]:
    return error_response(exc)


def _unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    # Never leak a stack trace to a client; the log keeps it.
    _log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(APIError(500, "The server had an error while processing your request.", type="server_error"))


EXCEPTION_HANDLERS: dict[type[Exception], Any] = {
    APIError: _api_error,
    HTTPException: _http_error,
    Exception: _unexpected,
}
