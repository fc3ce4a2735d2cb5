"""What crosses the pipe between the API process and the engine process under `--isolate`.

Every message is a small picklable dataclass. Deltas travel in one `Deltas` message per engine
iteration for all rows (never one message per token), errors as `ErrorInfo` (the typed engine error,
rebuilt on the other side so the API maps it to HTTP exactly as in-process).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import audio.errors as audio_errors
import engine.errors as engine_errors
from engine.contracts import Delta, GenerationRequest

__all__ = ["Submit", "Cancel", "RefuseQueued", "Shutdown", "Ready", "Deltas", "Rejected", "Snapshot", "Failed", "ErrorInfo",
           "AUTHKEY_ENV", "ADDRESS_ENV"]

# The engine process finds its way back to the API process through these (set by the supervisor).
ADDRESS_ENV = "TANDEM_ISOLATE_ADDRESS"
AUTHKEY_ENV = "TANDEM_ISOLATE_AUTHKEY"


@dataclass
class ErrorInfo:
    """A typed engine or audio error as plain data (exceptions with keyword-only fields do not unpickle):
    its class name, message, and the simple fields it carries (param, code, retry_after...)."""

    kind: str
    message: str
    param: str | None = None
    code: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, exc: BaseException) -> "ErrorInfo":
        """Raises nothing."""
        simple = {k: v for k, v in vars(exc).items()
                  if not k.startswith("_") and k != "message" and isinstance(v, (str, int, float, bool, type(None)))}
        return cls(type(exc).__name__, str(exc), getattr(exc, "param", None), getattr(exc, "code", None), simple)

    def exception(self) -> Exception:
        """The error again, of its own type when engine.errors or audio.errors defines it (else a
        RuntimeError with its text). Raises nothing."""
        kind = next((k for module in (engine_errors, audio_errors) if isinstance(k := getattr(module, self.kind, None), type)
                     and issubclass(k, Exception)), None)
        if kind is None:
            return RuntimeError(self.message)
        values = {"param": self.param, "code": self.code, **self.fields}
        try:
            params = inspect.signature(kind).parameters
            exc = kind(self.message, **{k: v for k, v in values.items()
                                        if k in params and params[k].kind is inspect.Parameter.KEYWORD_ONLY})
        except (TypeError, ValueError):  # a constructor that wants more: keep the text
            return RuntimeError(self.message)
        for key, value in values.items():
            if not hasattr(exc, key) or getattr(exc, key) is None:
                setattr(exc, key, value)
        return exc


# -- API process → engine process --------------------------------------------------------------------


@dataclass
class Submit:
    rid: int
    request: GenerationRequest


@dataclass
class Cancel:
    rid: int


@dataclass
class RefuseQueued:
    """Shutting down: end the rows still queued, refuse new ones (engine.runtime.Engine.refuse_queued)."""


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
    # The engine process's SpeechService, served by reference (service/isolate/objects.py), and its names.
    speech: Any = None
    speech_aliases: list[str] = field(default_factory=list)
    # The model's recommended sampling (generation_config.json) for fields a request leaves out.
    sampling_defaults: dict[str, float] = field(default_factory=dict)
    # Where the model comes from (ChatEngine.model_root): /v1/models' `root`.
    model_root: str | None = None
    # The most tokens one request can have (ChatEngine.max_model_len: the budget may hold less than the context).
    max_model_len: int | None = None


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
