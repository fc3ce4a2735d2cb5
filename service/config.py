"""ServiceConfig — what `tandem serve` was asked for, passed to the granian worker through the environment.

granian builds the app in a worker process from an import path (`service.app:app_from_env`), so the
options travel as JSON in TANDEM_SERVE_CONFIG; single env vars (TANDEM_MODEL, ...) override it, which
lets `granian --interface asgi --factory service.app:app_from_env` be used directly.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["ServiceConfig", "CONFIG_ENV"]

CONFIG_ENV = "TANDEM_SERVE_CONFIG"

# Single-variable overrides: env name → (field, type).
_OVERRIDES: dict[str, tuple[str, type]] = {
    "TANDEM_MODEL": ("model", str),
    "TANDEM_MAX_ACTIVE": ("max_active", int),
    "TANDEM_MAX_ITERATION_TOKENS": ("max_iteration_tokens", int),
    "TANDEM_PROMPT_CACHE_BYTES": ("prompt_cache_bytes", int),
    "TANDEM_MEMORY_BUDGET": ("memory_budget", int),
    "TANDEM_LOG_LEVEL": ("log_level", str),
}


@dataclass
class ServiceConfig:
    """Server options. Subsystems with their own options (speech, pi) keep them under `extra`."""

    model: str | None = None
    max_active: int = 16
    max_iteration_tokens: int = 512
    prompt_cache_bytes: int | None = None
    # Bytes for weights, KV, prefix cache and MLX's buffer cache; None: the machine's default.
    memory_budget: int | None = None
    # Run internal generations before serving so kernels compile first; None: on a GPU only.
    warmup: bool | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    # Loaded-model name shown in /v1/models; default: what engine.model_name says.
    served_model_name: str | None = None
    # Level of our loggers (service/logs.py) and granian's in the worker.
    log_level: str = "info"
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """The config as JSON for CONFIG_ENV. Raises TypeError for values JSON cannot hold."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "ServiceConfig":
        """Read CONFIG_ENV (JSON) then the single-variable overrides. Unknown JSON keys are ignored.

        Raises ValueError for malformed JSON or a non-integer numeric override."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        if raw := env.get(CONFIG_ENV):
            try:
                loaded = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{CONFIG_ENV} is not valid JSON: {exc}") from exc
            known = {f.name for f in dataclasses.fields(cls)}
            values = {k: v for k, v in loaded.items() if k in known}
        for name, (key, kind) in _OVERRIDES.items():
            if (raw_value := env.get(name)) not in (None, ""):
                try:
                    values[key] = kind(raw_value)
                except ValueError as exc:
                    raise ValueError(f"{name} must be {kind.__name__}, got {raw_value!r}") from exc
        return cls(**values)
