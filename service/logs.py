"""Logging for the `tandem` process and the server's worker: our loggers (engine, audio, service, the
access log) go to stderr at the `--log-level` the user chose; granian keeps its own levels, on stderr too
(its default is stdout, which a script reading a command's output should find clean).

`--log-format text` (the default) keeps the lines people and tests read (`tandem: message`, granian's
`[INFO] message`); `--log-format json` writes every line, ours and granian's, as one JSON object for log
collectors (Loki, Elasticsearch, Datadog, CloudWatch): time, level, logger, message, a record's extra fields
(the access log's method, path, status...), and an exception's traceback."""

from __future__ import annotations

import copy
import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["LOG_LEVELS", "LOG_FORMATS", "OUR_LOGGERS", "JsonFormatter", "ClosedSocketNoise", "configure_logging",
           "granian_log_config", "notice"]

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
# Top-level logger names of this project's packages (module loggers are named after their module).
OUR_LOGGERS = ("tandem", "engine", "audio", "service", "bench")

# What every LogRecord carries: anything else on a record came from `extra=` and becomes a key of its JSON line.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime",
                                                                                         "taskName"}
# The keys a JSON line always has: an `extra` of the same name must not replace them.
_OWN_KEYS = frozenset({"time", "level", "logger", "message", "exc_info", "stack_info"})


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: `time` (RFC 3339, UTC, milliseconds), `level`, `logger`,
    `message`, the record's extra fields (and a mapping passed as its only argument: granian's access log's),
    `exc_info` / `stack_info` as text. The stdlib's Formatter and json.dumps: no JSON-logging library is a
    dependency, and this is all it takes."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = dict(record.args) if isinstance(record.args, Mapping) else {}
        fields.update((key, value) for key, value in vars(record).items() if key not in _RECORD_ATTRIBUTES)
        line.update((key, value) for key, value in fields.items() if key not in _OWN_KEYS)
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc_info"] = record.exc_text
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        # ASCII: a client's text in a field (a path, a user id) cannot break the line; default=str: any extra.
        return json.dumps(line, ensure_ascii=True, default=str)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (tests swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def configure_logging(level: str = "info", log_format: str = "text") -> None:
    """Send our loggers to stderr at `level` (one of LOG_LEVELS) in `log_format` (one of LOG_FORMATS); idempotent,
    the last call's level and format win. With json, other libraries' warnings (the root logger's) are JSON lines
    too. Raises ValueError for an unknown level or format."""
    if level not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    numeric = getattr(logging, level.upper())
    fmt = "tandem %(levelname)s %(name)s: %(message)s" if numeric <= logging.DEBUG else "tandem: %(message)s"
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(fmt)
    for name in OUR_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(numeric)
        logger.propagate = False
        _handler(logger).setFormatter(formatter)
    root = logging.getLogger()
    if log_format == "json":  # else Python's last resort writes them as bare text
        _handler(root).setFormatter(formatter)
    else:
        for handler in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
            root.removeHandler(handler)


def _handler(logger: logging.Logger) -> _StderrHandler:
    """`logger`'s stderr handler, added if it has none. Raises nothing."""
    handler = next((h for h in logger.handlers if isinstance(h, _StderrHandler)), None)
    if handler is None:
        handler = _StderrHandler(sys.stderr)
        logger.addHandler(handler)
    return handler


def notice(logger: logging.Logger, message: str) -> None:
    """Write `message` at INFO through `logger`'s handlers, in the chosen format, whatever the logger's level: a
    line the user must see at any --log-level. Raises nothing."""
    logger.handle(logger.makeRecord(logger.name, logging.INFO, "(notice)", 0, message, (), None))


# granian's info lines for a websocket whose client left (no request id beside them).
_CLOSED_SOCKET_LINES = ("Failed to close websocket", "Attempted to write to a closed websocket")


class ClosedSocketNoise(logging.Filter):
    """Drops granian's info lines for a websocket whose client left before the close handshake ("Failed to close
    websocket with error Io(... BrokenPipe ...)", "Attempted to write to a closed websocket"): the access log already
    says the client left, once per socket; 21 such lines came for 28 sockets cut by a proxy."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and record.getMessage().startswith(_CLOSED_SOCKET_LINES))


def granian_log_config(log_format: str = "text") -> dict[str, Any]:
    """granian's logging config (its levels; its `[INFO] ...` lines, or with `log_format` json ours) with every
    handler on stderr instead of stdout, for granian's log_dictconfig. Raises nothing."""
    from granian.log import LOGGING_CONFIG

    config: dict[str, Any] = copy.deepcopy(LOGGING_CONFIG)
    handlers: dict[str, dict[str, Any]] = config.get("handlers", {})
    config.setdefault("filters", {})["closed_sockets"] = {"()": f"{__name__}.ClosedSocketNoise"}
    for handler in handlers.values():
        if handler.get("stream") == "ext://sys.stdout":
            handler["stream"] = "ext://sys.stderr"
        handler.setdefault("filters", []).append("closed_sockets")
    if log_format == "json":  # the worker imports this module by name (dictConfig's "()")
        formatters: dict[str, dict[str, Any]] = config.get("formatters", {})
        for name in formatters:
            formatters[name] = {"()": f"{__name__}.JsonFormatter"}
    return config
