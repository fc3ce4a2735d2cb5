"""How every `tandem` command builds its parser: help on every flag with its default shown, and the
options all commands share (--log-level, --log-format)."""

from __future__ import annotations

import argparse
import math
import re
from typing import Any, Callable

from service.logs import LOG_FORMATS, LOG_LEVELS

__all__ = ["add_command", "common_options", "HelpFormatter", "byte_size", "gc_thresholds", "checked", "positive_int"]

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 10**3, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6, "mib": 1 << 20,
          "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40, "tb": 10**12, "tib": 1 << 40}


def byte_size(text: str) -> int:
    """'12GiB', '800M', '1.5G' or a plain byte count → bytes. Raises argparse.ArgumentTypeError."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 12GiB, 800M or a byte count)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


# Longest duration a seconds flag takes (11.6 days): larger ones overflow timers (1e300 s failed at shutdown).
MAX_SECONDS = 1e6


def finite(text: str) -> float:
    """A finite number (nan and inf are not: they passed `> 0` checks and failed later). Raises
    argparse.ArgumentTypeError."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def seconds(text: str) -> float:
    """A duration in seconds: finite, 0 to MAX_SECONDS (each flag says whether 0 is allowed). Raises
    argparse.ArgumentTypeError."""
    value = finite(text)
    if not 0 <= value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"not a duration in seconds from 0 to {MAX_SECONDS:g}: {text!r}")
    return value


def gc_thresholds(text: str) -> tuple[int, int, int]:
    """'20000' or '20000,20,20' → Python's three collection thresholds (the ones not given keep Python's
    defaults, 10). Raises argparse.ArgumentTypeError."""
    parts = [p.strip() for p in text.split(",")]
    # gc.set_threshold takes C ints: a larger count was accepted here and failed the worker at ready.
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() and 0 < int(p) <= 10**9 for p in parts):
        raise argparse.ArgumentTypeError(f"not gc thresholds: {text!r} (use e.g. 20000 or 20000,20,20; each "
                                         "from 1 to 1000000000)")
    values = [int(p) for p in parts] + [10] * (3 - len(parts))
    return values[0], values[1], values[2]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends `(default: X)` to every option's help, unless the help already says its default in words
    or the option is an on/off flag (off unless given)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "(default" in text or action.default is None or isinstance(
                action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return text
        return super()._get_help_string(action)


def checked(kind: type[int] | type[float], ok: Callable[[float], bool], what: str) -> Callable[[str], Any]:
    """An argparse type: `kind(text)`, refused unless `ok` (saying it must be `what`). Raises nothing."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {'an integer' if kind is int else 'a number'}: {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value
    return parse


positive_int = checked(int, lambda v: v >= 1, ">= 1")


def common_options() -> argparse.ArgumentParser:
    """A parent parser with the options every command takes. Raises nothing."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", default="info", choices=LOG_LEVELS, type=str.lower,  # DEBUG as mlx-lm spells it
                        help="level of tandem's own logs (engine, speech, access log)")
    common.add_argument("--log-format", default="text", choices=LOG_FORMATS, type=str.lower,
                        help="text: `tandem: message` lines (granian's `[INFO] message`); json: every log line, "
                             "granian's and the access log's included, as one JSON object (time, level, logger, "
                             "message, the access log's method, path, status, duration_ms...) for log collectors")
    return common


def add_command(sub: Any, name: str, help: str, *, description: str | None = None) -> argparse.ArgumentParser:
    """A subcommand parser whose help shows every default. Raises nothing."""
    # No abbreviations: `--prompt 5` was taken as `--prompt-cache-bytes 5`, `--max-tokens` as `--max-tokens-cap`.
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=description or help, parents=[common_options()],
        formatter_class=HelpFormatter, allow_abbrev=False)
    return parser
