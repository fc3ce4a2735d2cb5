"""Logging for the `tandem` process and the server's worker: our loggers (engine, audio, service, the
access log) go to stderr at the `--log-level` the user chose; granian keeps its own format and levels, on stderr too
(its default is stdout, which a script reading a command's output should find clean)."""

from __future__ import annotations

import copy
import logging
import sys
from typing import Any

__all__ = ["LOG_LEVELS", "OUR_LOGGERS", "configure_logging", "granian_log_config"]

LOG_LEVELS = ("debug", "info", "warning", "error")
# Top-level logger names of this project's packages (module loggers are named after their module).
OUR_LOGGERS = ("tandem", "engine", "audio", "service", "bench")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (tests swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def configure_logging(level: str = "info") -> None:
    """Send our loggers to stderr at `level` (one of LOG_LEVELS); idempotent, the last call's level wins.
    Raises ValueError for an unknown level."""
    if level not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    numeric = getattr(logging, level.upper())
    fmt = "tandem %(levelname)s %(name)s: %(message)s" if numeric <= logging.DEBUG else "tandem: %(message)s"
    for name in OUR_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(numeric)
        logger.propagate = False
        handler = next((h for h in logger.handlers if isinstance(h, _StderrHandler)), None)
        if handler is None:
            handler = _StderrHandler(sys.stderr)
            logger.addHandler(handler)
        handler.setFormatter(logging.Formatter(fmt))


def granian_log_config() -> dict[str, Any]:
    """granian's logging config (its `[INFO] ...` lines, its levels) with every handler on stderr instead of stdout,
    for granian's log_dictconfig. Raises nothing."""
    from granian.log import LOGGING_CONFIG

    config: dict[str, Any] = copy.deepcopy(LOGGING_CONFIG)
    handlers: dict[str, dict[str, Any]] = config.get("handlers", {})
    for handler in handlers.values():
        if handler.get("stream") == "ext://sys.stdout":
            handler["stream"] = "ext://sys.stderr"
    return config
