"""`tandem openapi [--check]`: write openapi/openapi.json from the app, or check it is current."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from service.cli.parsers import add_command

__all__ = ["add_openapi"]


def add_openapi(sub: Any) -> None:
    """Register `tandem openapi`. Raises nothing."""
    p = add_command(sub, "openapi", "write openapi/openapi.json from the app (or --check it)")
    p.add_argument("--check", action="store_true", help="exit 1 when the file differs from the app's schema")
    p.add_argument("--output", default=None, help="path (default: openapi/openapi.json in the repo)")
    p.set_defaults(func=_openapi)


def _openapi(args: argparse.Namespace) -> int:
    from service.openapi_document import SPEC_PATH, openapi_drift, write_openapi

    path = Path(args.output) if args.output else SPEC_PATH
    if args.check:
        drift = openapi_drift(path)
        if drift:
            print(drift, file=sys.stderr)
            return 1
        print(f"{path} is up to date")
        return 0
    print(write_openapi(path))
    return 0
