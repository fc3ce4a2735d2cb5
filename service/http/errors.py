"""Errors in OpenAI's shape `{"error": {"message", "type", "param", "code"}}`, and ERROR_TABLE: the one
place a typed engine or audio error becomes an HTTP status, type and code (by type, never by message).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Mapping

from litestar import Response

from audio.buffers import AudioBufferFull, SessionAudioLimit, SessionBacklogFull
from audio.errors import (
    AudioInputError,
    ChunkOverBacklog,
    InvalidOption,
    SessionClosed,
    SessionLimit,
    SessionNotFound,
    SpeechNotRunning,
    SpeechStopped,
    WhisperCheckpointError,
)
from engine.errors import (
    ContextTooLong,
    EngineClosed,
    EngineRestarting,
    InvalidRequest,
    InvalidSampling,
    MemoryAdmission,
    ModelNotFound,
    NoChatModel,
    QueueFull,
    TaskRejected,
)

__all__ = [
    "APIError",
    "ErrorRule",
    "ERROR_TABLE",
    "api_error",
    "error_body",
    "error_event",
    "event_id",
    "frames_error_event",
    "error_response",
    "in_band_error",
    "model_not_found",
    "context_length_exceeded",
    "INTERNAL_ERROR_MESSAGE",
    "DEFAULT_CODES",
    "unavailable",
]

INTERNAL_ERROR_MESSAGE = "The server had an error while processing your request."

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    408: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
}

# The code an error gets when whoever raised it named none: a client always gets a machine-readable code.
DEFAULT_CODES = {
    400: "invalid_request",
    401: "invalid_api_key",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "request_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "rate_limit_exceeded",
    500: "internal_error",
    503: "unavailable",
    504: "request_timeout",
}


class APIError(Exception):
    """An error a route raises on purpose; rendered as-is in OpenAI's shape."""

    def __init__(
        self, status: int, message: str, *, type: str | None = None, param: str | None = None, code: str | None = None,
        retry_after: int | None = None, close: bool = False, should_retry: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.param = param
        self.code = code or DEFAULT_CODES.get(status, "server_error" if status >= 500 else "invalid_request")
        # Seconds a client should wait before retrying (429, 503): sent as the Retry-After header.
        self.retry_after = retry_after
        # The request's body was left unread: the connection cannot carry another request (Connection: close).
        self.close = close
        # x-should-retry, which the openai SDKs obey over their status rules (which retry 408, 409, 429 and every
        # 5xx): False where the same request fails the same way again; None leaves it to those rules.
        self.should_retry = should_retry

    @property
    def headers(self) -> dict[str, str]:
        """Response headers the error carries (Retry-After, Connection, x-should-retry). Raises nothing."""
        return ({"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}) | \
            ({"Connection": "close"} if self.close else {}) | \
            ({"x-should-retry": "true" if self.should_retry else "false"} if self.should_retry is not None else {})


def unavailable(message: str, *, code: str = "unavailable", retry_after: int = 5) -> APIError:
    """503 with Retry-After: the server is loading, restarting or shutting down. Raises nothing."""
    return APIError(503, message, type="server_error", code=code, retry_after=retry_after)


def model_not_found(model: str, available: list[str]) -> APIError:
    """404 for a model this server does not serve (a long name shown cut: a 1 MB name made a 1 MB answer).
    Raises nothing."""
    served = ", ".join(available) or "none"
    shown = model if len(model) <= 80 else model[:80] + "…"
    return APIError(
        404,
        f"The model `{shown}` does not exist or is not served here (served: {served}).",
        param="model",
        code="model_not_found",
    )


def model_of_another_kind(model: str, kind: str, served: str | None) -> APIError:
    """404 for a model this server serves, named on a route for another kind (a client listing /v1/models offers
    Whisper for chat): says what it is and which model the route serves. Raises nothing."""
    shown = model if len(model) <= 80 else model[:80] + "…"
    here = f"this route serves `{served}`" if served else "this route's kind of model is not served here"
    return APIError(404, f"The model `{shown}` is {kind}; {here}.", param="model", code="model_not_found")


def context_length_exceeded(detail: str, param: str = "messages") -> APIError:
    """400 for a prompt that cannot fit the model's context. Raises nothing."""
    return APIError(400, detail, param=param, code="context_length_exceeded")


def error_body(error: APIError) -> dict[str, Any]:
    """The JSON body for an error. Raises nothing."""
    return {"error": {"message": error.message, "type": error.type, "param": error.param, "code": error.code}}


def event_id() -> str:
    return f"event_{uuid.uuid4().hex[:20]}"


def error_event(error: APIError, client_event_id: str | None = None) -> dict[str, Any]:
    """An `error` server event of a Realtime socket for `error` (OpenAI's shape). Raises nothing."""
    return {"type": "error", "event_id": event_id(),
            "error": {"type": error.type, "code": error.code, "message": error.message, "param": error.param,
                      "event_id": client_event_id}}


def frames_error_event(error: APIError) -> dict[str, Any]:
    """error_event with the binary-frame clients' flat fields too (message, code, param): what a socket says
    before it knows which kind of client it serves. Raises nothing."""
    return error_event(error) | {"message": error.message, "code": error.code, "param": error.param}


def error_response(error: APIError, headers: Mapping[str, str] | None = None) -> Response[dict[str, Any]]:
    """A Litestar response for an error (with Retry-After when it carries one, and `headers`, e.g. a 405's
    Allow). Raises nothing."""
    headers = {**(headers or {}), **error.headers,
               **({"WWW-Authenticate": "Bearer"} if error.status == 401 else {})}
    return Response(error_body(error), status_code=error.status, media_type="application/json", headers=headers)




@dataclass(frozen=True)
class ErrorRule:
    """How one exception type is answered. `code` None: the exception's own `code`; `param`: used when
    the exception names none; `message` is formatted with the exception as `exc`."""

    status: int
    code: str | None = None
    type: str | None = None
    param: str | None = None
    message: str = "{exc}"
    retry_after: int | None = None
    should_retry: bool | None = None  # False: a retry fails the same way (see APIError.should_retry)


# Every typed error of the layers below, and its HTTP answer. A subclass not listed uses its nearest base.
ERROR_TABLE: dict[type[Exception], ErrorRule] = {
    # engine/errors.py
    ContextTooLong: ErrorRule(400, "context_length_exceeded"),
    InvalidSampling: ErrorRule(400, "invalid_value"),
    InvalidRequest: ErrorRule(400, "invalid_value"),
    MemoryAdmission: ErrorRule(400, type="memory_admission"),
    NoChatModel: ErrorRule(404, "model_not_found", param="model"),
    ModelNotFound: ErrorRule(404, "model_not_found", param="model"),
    QueueFull: ErrorRule(429, "queue_full", retry_after=1, message="The server is at capacity: {exc}"),
    EngineClosed: ErrorRule(503, "unavailable", message="The engine is not accepting requests: {exc}", retry_after=5),
    EngineRestarting: ErrorRule(503, "engine_restarting", retry_after=5),
    TaskRejected: ErrorRule(503, "unavailable", message="The server is shutting down or the request was cancelled.",
                            retry_after=5),
    # audio/errors.py
    AudioInputError: ErrorRule(400),
    SessionAudioLimit: ErrorRule(413),  # the session can never take more
    AudioBufferFull: ErrorRule(429),  # retry once sessions caught up (Retry-After)
    SessionBacklogFull: ErrorRule(429),  # this session sends faster than it is transcribed
    ChunkOverBacklog: ErrorRule(413),  # no retry takes a chunk that alone passes the backlog
    InvalidOption: ErrorRule(400),
    SessionNotFound: ErrorRule(404),
    SessionClosed: ErrorRule(409, should_retry=False),  # closed for good; the SDKs retry a 409 otherwise
    SessionLimit: ErrorRule(429),  # full house: retry later (Retry-After), never an eviction
    SpeechNotRunning: ErrorRule(503),
    SpeechStopped: ErrorRule(503, retry_after=5),  # shutting_down: another server (or this one restarted) may take it
    WhisperCheckpointError: ErrorRule(503, type="server_error", message="The Whisper model could not be loaded: {exc}",
                                      should_retry=False),  # the checkpoint stays unloadable
}


def _rule(exc: BaseException) -> ErrorRule | None:
    for klass in type(exc).__mro__:
        if (rule := ERROR_TABLE.get(klass)) is not None:
            return rule
    return None


def api_error(exc: BaseException, *, params: Mapping[str, str] | None = None) -> APIError:
    """The API error for `exc` by ERROR_TABLE (an APIError as it is; anything else a generic 500).
    `params` renames the layer's field names to the request's (e.g. {"prompt": "messages"}). Raises nothing."""
    if isinstance(exc, APIError):
        return exc
    rule = _rule(exc)
    if rule is None:
        return APIError(500, INTERNAL_ERROR_MESSAGE, type="server_error")
    param = getattr(exc, "param", None) or rule.param
    if param is not None and params:
        param = params.get(param, param)
    code = rule.code or getattr(exc, "code", None)
    # The exception's own retry_after (EngineRestarting knows how long) wins over the table's.
    retry_after = getattr(exc, "retry_after", None)
    return APIError(rule.status, rule.message.format(exc=exc), type=rule.type, param=param, code=code,
                    retry_after=retry_after if isinstance(retry_after, int) else rule.retry_after,
                    should_retry=rule.should_retry)


def in_band_error(exc: BaseException) -> APIError:
    """The error a stream reports after its headers went out (as an SSE event): typed errors by the table,
    anything else as a 500 carrying its message. Raises nothing."""
    if isinstance(exc, APIError) or _rule(exc) is not None:
        return api_error(exc)
    return APIError(500, str(exc) or type(exc).__name__, type="server_error")
