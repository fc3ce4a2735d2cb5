"""`tandem` — the command line. Each command is a module here that adds its parser and sets `func`;
`func(args)` returns the exit code. Expected failures (no model, bad input) print one line on stderr and
exit non-zero, no traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Callable

from engine.gil import gil_switch_seconds
from service.cli.benchmark import add_benchmark
from service.cli.dictate import add_dictate
from service.cli.errors import CLIError
from service.cli.generate import add_generate
from service.cli.models import add_models
from service.cli.openapi import add_openapi
from service.cli.pi import add_pi, is_pi_help
from service.cli.serve import add_serve
from service.cli.transcribe import add_transcribe
from service.cli.version import VersionAction
from service.logs import configure_logging

__all__ = ["main", "build_parser", "COMMANDS"]

# Adders of the top-level commands, in the order `tandem --help` lists them.
COMMANDS: list[Callable[[Any], None]] = [
    add_serve, add_generate, add_transcribe, add_dictate, add_models, add_pi, add_benchmark, add_openapi,
]


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser. Raises nothing."""
    parser = argparse.ArgumentParser(prog="tandem", description="Chat and speech on one cooperative MLX scheduler.")
    parser.add_argument("-V", "--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def _command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of a top-level command (the top level's when none is found). Raises nothing."""
    for action in parser._actions:  # argparse keeps its subcommands' parsers only on this action
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `tandem` console script; returns the exit code. Raises SystemExit on --help."""
    argv = sys.argv[1:] if argv is None else argv
    say: Callable[[str], None] = _plain
    # Ctrl-C at any point, loading the BLAS and the command's modules included, exits 130 without a traceback.
    try:
        if argv[:1] == ["pi"] and not is_pi_help(argv[1:]):  # pi's own options (-p, --model...) pass through
            from service.pi.command import pi_command

            return pi_command(argv[1:])
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # named in the command's own usage (`tandem serve --bogus` showed the top level's)
            _command_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
        configure_logging(args.log_level, args.log_format)
        if args.log_format == "json":  # a collector parses every line, a failure to start most of all
            say = logging.getLogger("tandem.cli").error
        from engine.backend import ensure_fast_blas

        ensure_fast_blas()  # before any command imports mlx (a no-op where MLX brings its own BLAS)
        _check_environment()
        return int(args.func(args) or 0)
    except CLIError as exc:
        say(str(exc))
        return exc.code
    except BrokenPipeError:
        return _reader_gone()
    except BaseExceptionGroup as group:  # a command's task group wraps what its output callback raised
        if group.split(BrokenPipeError)[1] is not None:
            raise
        return _reader_gone()
    except OSError as exc:
        if exc.filename is None:
            raise  # not a file the environment denies: a fault with its traceback
        # An unwritable HOME or cache directory ended `serve` with a traceback from deep in a model import.
        say(f"cannot use {exc.filename}: {exc.strerror or exc} (the cache is $XDG_CACHE_HOME/mlx-tandem, "
            f"default ~/.cache/mlx-tandem: point it at a writable directory)")
        return 1
    except KeyboardInterrupt:
        return 130


def _plain(message: str) -> None:
    print(f"tandem: {message}", file=sys.stderr)


def _reader_gone() -> int:
    """The reader of stdout left (`tandem generate ... | head -c 10`): stop quietly, as `transcribe` does, with
    stdout pointed at /dev/null so the interpreter's last flush raises nothing. Returns 0."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 0


def _check_environment() -> None:
    """Raise CLIError for a tuning variable every engine reads (one line up front, not a traceback mid-command)."""
    try:
        gil_switch_seconds()
    except ValueError as exc:
        raise CLIError(str(exc)) from None
