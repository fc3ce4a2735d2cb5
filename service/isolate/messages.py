"""What crosses the pipe between the API process and the engine process under `--isolate`.

Every message is a small picklable dataclass. Deltas travel in one `Deltas` message per engine
iteration for all rows (never one message per token), errors as `ErrorInfo` (the typed engine error,
rebuilt on the other side so the API maps it to HTTP exactly as in-process).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import engine.errors as engine_errors
from engine.contracts import Delta, GenerationRequest

__all__ = ["Submit", "Cancel", "Shutdown", "Ready", "Deltas", "Rejected", "Snapshot", "Failed", "ErrorInfo",
           "AUTHKEY_ENV", "ADDRESS_ENV"]

# The engine process finds its way back to the API process through these (set by the supervisor).
ADDRESS_ENV = "TANDEM_ISOLATE_ADDRESS"
AUTHKEY_ENV = "TANDEM_ISOLATE_AUTHKEY"


@dataclass
class ErrorInfo:
    """A typed engine error as plain data (exceptions with keyword-only fields do not unpickle)."""

    kind: str
    message: str
    param: str | None = None
    code: str | None = None

    @classmethod
    def of(cls, exc: BaseException) -> "ErrorInfo":
        """Raises nothing."""
        return cls(type(exc).__name__, str(exc), getattr(exc, "param", None), getattr(exc, "code", None))

    def exception(self) -> Exception:
        """The engine error again (engine.errors by name; anything else a RuntimeError). Raises nothing."""
        kind = getattr(engine_errors, self.kind, None)
        if not (isinstance(kind, type) and issubclass(kind, engine_errors.EngineError)):
            return RuntimeError(self.message)
        if issubclass(kind, engine_errors.MemoryAdmission):
            return kind(self.message, code=self.code or "context_over_budget", param=self.param)
        if issubclass(kind, engine_errors.InvalidRequest):
            return kind(self.message, param=self.param)
        try:
            return kind(self.message)
        except TypeError:  # a type whose constructor wants more: keep the text
            return RuntimeError(self.message)


# -- API process → engine process --------------------------------------------------------------------


@dataclass
class Submit:
    rid: int
    request: GenerationRequest


@dataclass
class Cancel:
    rid: int


@dataclass
class Shutdown:
    """Close the engine (rows end as cancelled) and exit."""


# -- engine process → API process --------------------------------------------------------------------


@dataclass
class Ready:
    """The model is loaded and warmed up; what the API process needs to serve it."""

    model_name: str | None
    context_length: int | None
    vocab_size: int | None
    tokenizer_dir: str | None
    plan_reasons: list[str] = field(default_factory=list)
    pid: int = 0


@dataclass
class Deltas:
    """Everything the rows produced since the last message, in order: (rid, delta)."""

    items: list[tuple[int, Delta]]


@dataclass
class Rejected:
    """The engine refused a Submit (the typed error the in-process engine would have raised)."""

    rid: int
    error: ErrorInfo


@dataclass
class Snapshot:
    """engine.stats() and engine.health(), pushed about twice a second."""

    stats: dict[str, Any]
    health: dict[str, Any]


@dataclass
class Failed:
    """The engine process could not start (its model did not load): the reason, then it exits."""

    error: ErrorInfo
