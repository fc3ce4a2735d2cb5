"""`tandem pi`: its parser (for --help) — the command itself lives in service/pi/command.py, and its
arguments after our own options pass to pi unparsed."""

from __future__ import annotations

import argparse
from typing import Any

from service.cli.parsers import HelpFormatter

__all__ = ["add_pi", "is_pi_help"]

_DESCRIPTION = (
    "Write pi's provider entry for this server into pi's agent dir, start `tandem serve` in the background "
    "when nothing answers on the port, then run pi. Every argument after ours goes to pi unchanged; "
    "`tandem pi -- --help` shows pi's own help. pi itself is installed with "
    "`npm install -g @mariozechner/pi-coding-agent`."
)


def add_pi(sub: Any) -> None:
    """Register `tandem pi` for its help: main hands `pi ...` to service.pi.command unparsed (pi's own
    options must pass through untouched), except a leading -h/--help. Raises nothing."""
    p = sub.add_parser("pi", help="run the pi coding agent against this server (starts one if needed)",
                       description=_DESCRIPTION, formatter_class=HelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="the server's address")
    p.add_argument("--port", type=int, default=8080, help="the server's port (or $TANDEM_PORT)")
    p.add_argument("--serve-model", default=None, help="chat model for a server started here (default: the demo)")
    p.add_argument("--api-key", default=None,
                   help="key the server asks for, written into pi's provider entry; a server started here "
                        "requires it (default: the first of $TANDEM_API_KEY; none)")
    p.add_argument("pi_args", nargs=argparse.REMAINDER, help="passed to pi unchanged (e.g. -p \"question\")")


def is_pi_help(argv: list[str]) -> bool:
    """True when `tandem pi ARGS` asks for our help (-h/--help before any pi argument). Raises nothing."""
    return bool(argv) and argv[0] in ("-h", "--help")
