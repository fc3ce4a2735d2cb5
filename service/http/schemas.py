"""The error body every route answers with, in OpenAI's shape — the OpenAPI source for 4xx/5xx."""

from __future__ import annotations

from pydantic import BaseModel

__all__ = ["ErrorBody", "ErrorResponse"]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    # Always set: a machine-readable reason (e.g. invalid_value, queue_full, request_timeout).
    code: str


class ErrorResponse(BaseModel):
    """Every error, in OpenAI's shape."""

    error: ErrorBody
