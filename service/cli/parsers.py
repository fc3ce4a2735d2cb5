"""How every `tandem` command builds its parser: help on every flag with its default shown, and the
options all commands share (--log-level)."""

from __future__ import annotations

import argparse
from typing import Any

from service.logs import LOG_LEVELS

__all__ = ["add_command", "common_options", "HelpFormatter"]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends `(default: X)` to every option's help, unless the help already says its default in words
    or the option is an on/off flag (off unless given)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "(default" in text or action.default is None or isinstance(
                action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return text
        return super()._get_help_string(action)


def common_options() -> argparse.ArgumentParser:
    """A parent parser with the options every command takes. Raises nothing."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", default="info", choices=LOG_LEVELS,
                        help="level of tandem's own logs (engine, speech, access log)")
    return common


def add_command(sub: Any, name: str, help: str, *, description: str | None = None) -> argparse.ArgumentParser:
    """A subcommand parser whose help shows every default. Raises nothing."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=description or help, parents=[common_options()],
        formatter_class=HelpFormatter)
    return parser
