"""`tandem openapi [--check]`: write openapi/openapi.json from the app, or check it is current."""

from __future__ import annotations

import argparse
import errno
import sys
from pathlib import Path
from typing import Any

from service.cli.errors import CLIError
from service.cli.parsers import add_command

__all__ = ["add_openapi"]

# Why a path cannot be written that the user can fix by naming another (others are the disk's: ENOSPC, EIO).
_PATH_ERRORS = {errno.ENOENT, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.EROFS,
                errno.ENAMETOOLONG}


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
        try:
            drift = openapi_drift(path)
        except UnicodeDecodeError:  # one line, not a traceback: it is no JSON document
            raise CLIError(f"cannot check {path}: it is not UTF-8 text (not an OpenAPI document)") from None
        if drift:
            print(drift, file=sys.stderr)
            return 1
        print(f"{path} is up to date")
        return 0
    try:
        written = write_openapi(path)
    except OSError as exc:  # one line; exit 2 for a path that cannot be written (the user's), 1 for a failing disk
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else ""
        raise CLIError(f"cannot write {path}: {exc.strerror or exc}{where}",
                       code=2 if exc.errno in _PATH_ERRORS else 1) from None
    print(written)
    return 0
