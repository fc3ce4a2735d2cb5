"""The refusal of a Realtime session field: realtime_config.py and realtime_format.py raise it, the routes turn it into
a 400 (or an `error` event) naming the field as the client wrote it."""

from __future__ import annotations

from typing import Any

__all__ = ["ConfigError", "known_fields"]


class ConfigError(ValueError):
    """A session field that cannot be honoured; `param` names it as the client wrote it."""

    def __init__(self, message: str, param: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


def known_fields(obj: dict[str, Any], keys: set[str], where: str) -> None:
    """Raises ConfigError naming the first field of `obj` (under `where`) not in `keys`."""
    unknown = sorted(set(obj) - keys)
    if unknown:
        raise ConfigError(f"unknown field {unknown[0]!r}", f"{where}.{unknown[0]}", code="unknown_parameter")
