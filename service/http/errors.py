"""Errors in OpenAI's shape `{"error": {"message", "type", "param", "code"}}`, and ERROR_TABLE: the one
place a typed engine or audio error becomes an HTTP status, type and code (by type, never by message).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from litestar import Response

from audio.buffers import AudioBufferFull, SessionAudioLimit, SessionBacklogFull
from audio.errors import (
    AudioInputError,
    InvalidOption,
    SessionClosed,
    SessionLimit,
    SessionNotFound,
    SpeechNotRunning,
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
    TaskRejected,
)

__all__ = [
    "APIError",
    "ErrorRule",
    "ERROR_TABLE",
    "api_error",
    "error_body",
    "error_response",
    "in_band_error",
    "model_not_found",
    "context_length_exceeded",
    "INTERNAL_ERROR_MESSAGE",
]

INTERNAL_ERROR_MESSAGE = "The server had an error while processing your request."

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
        self.retry_after: int | None = None  # seconds, sent as Retry-After (429, 503)


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
    headers = {"Retry-After": str(error.retry_after)} if error.retry_after is not None else None
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


# Every typed error of the layers below, and its HTTP answer. A subclass not listed uses its nearest base.
ERROR_TABLE: dict[type[Exception], ErrorRule] = {
    # engine/errors.py
    ContextTooLong: ErrorRule(400, "context_length_exceeded"),
    InvalidSampling: ErrorRule(400, "invalid_value"),
    InvalidRequest: ErrorRule(400, "invalid_value"),
    MemoryAdmission: ErrorRule(400, type="memory_admission"),
    NoChatModel: ErrorRule(404, "model_not_found", param="model"),
    ModelNotFound: ErrorRule(404, "model_not_found", param="model"),
    EngineClosed: ErrorRule(503, "unavailable", message="The engine is not accepting requests: {exc}"),
    EngineRestarting: ErrorRule(503, "engine_restarting"),
    TaskRejected: ErrorRule(503, "unavailable", message="The server is shutting down or the request was cancelled."),
    # audio/errors.py
    AudioInputError: ErrorRule(400),
    SessionAudioLimit: ErrorRule(413),  # the session can never take more
    AudioBufferFull: ErrorRule(429),  # retry once sessions caught up (Retry-After)
    SessionBacklogFull: ErrorRule(429),  # this session sends faster than it is transcribed
    InvalidOption: ErrorRule(400),
    SessionNotFound: ErrorRule(404),
    SessionClosed: ErrorRule(409),
    SessionLimit: ErrorRule(429),  # full house: retry later (Retry-After), never an eviction
    SpeechNotRunning: ErrorRule(503),
    WhisperCheckpointError: ErrorRule(503, type="server_error", message="The Whisper model could not be loaded: {exc}"),
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
    error = APIError(rule.status, rule.message.format(exc=exc), type=rule.type, param=param, code=code)
    retry_after = getattr(exc, "retry_after", None)
    error.retry_after = retry_after if isinstance(retry_after, int) else None
    return error


def in_band_error(exc: BaseException) -> APIError:
    """The error a stream reports after its headers went out (as an SSE event): typed errors by the table,
    anything else as a 500 carrying its message. Raises nothing."""
    if isinstance(exc, APIError) or _rule(exc) is not None:
        return api_error(exc)
    return APIError(500, str(exc) or type(exc).__name__, type="server_error")
