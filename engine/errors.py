"""Why the engine refuses work — typed, so callers map them by type (service/http/errors.py), never by text.

Request errors carry `param`: the GenerationRequest field at fault ("prompt", "max_tokens", "temperature",
"logit_bias", ...). They subclass ValueError/RuntimeError as the engine raised before, so callers that
caught those keep working.
"""

from __future__ import annotations

__all__ = [
    "EngineError",
    "InvalidRequest",
    "InvalidSampling",
    "ContextTooLong",
    "EngineClosed",
    "NoChatModel",
    "ModelNotFound",
    "ModelUnsupported",
    "MemoryAdmission",
    "TaskRejected",
    "QueueFull",
    "EngineRestarting",
]


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class InvalidRequest(EngineError, ValueError):
    """A GenerationRequest the engine cannot run as given; `param` names the field."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidSampling(InvalidRequest):
    """A sampling setting no sampler can honour (temperature < 0, top_p outside (0, 1], ...)."""


class ContextTooLong(InvalidRequest):
    """The prompt plus max_tokens does not fit the model's context."""

    def __init__(self, message: str, *, param: str | None = "prompt") -> None:
        super().__init__(message, param=param)


class EngineClosed(EngineError, RuntimeError):
    """The engine is shutting down (or shut down) and accepts no more work."""


class NoChatModel(EngineError, RuntimeError):
    """A generation was submitted to an engine serving no chat model (a transcription-only server)."""


class ModelNotFound(EngineError):
    """No model matches the spec; the message says how to get one."""


class ModelUnsupported(EngineError, ValueError):
    """A checkpoint this engine cannot serve as it is (a quantization, a RoPE form, a memory budget that cannot hold
    it); the message names the config field or setting at fault."""


class MemoryAdmission(EngineError):
    """The request does not fit the memory the engine may use; `code` says which limit (e.g.
    "context_over_budget": its KV would exceed the budget even alone)."""

    def __init__(self, message: str, *, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param


class TaskRejected(EngineError):
    """A queued ExecutionTask never ran: the queue shut down or its caller cancelled it first."""


class QueueFull(EngineError):
    """Admission refused: `queued` requests already wait for a slot and at most `limit` may (max_queued)."""

    def __init__(self, message: str, *, queued: int = 0, limit: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.queued = queued
        self.limit = limit


class EngineRestarting(EngineError):
    """The engine process is (re)starting (`--isolate`): try again in `retry_after` seconds."""

    def __init__(self, message: str, *, retry_after: int = 5) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
