"""The refusal of a Realtime session field: realtime_config.py and realtime_format.py raise it, the routes turn it into
a 400 (or an `error` event) naming the field as the client wrote it."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A session field that cannot be honoured; `param` names it as the client wrote it."""

    def __init__(self, message: str, param: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code
