"""`tandem --version`: the installed distribution's version, else (a checkout run without installing it)
the one pyproject.toml names."""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from typing import Any

__all__ = ["DISTRIBUTION", "VersionAction", "tandem_version"]

DISTRIBUTION = "mlx-tandem"
_PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def tandem_version(pyproject: Path = _PYPROJECT) -> str:
    """The version of the mlx-tandem distribution, or pyproject's when it is not installed; "unknown" when
    neither says. Raises nothing."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        pass
    try:
        project = tomllib.loads(pyproject.read_text())["project"]
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown"
    return str(project.get("version", "unknown")) if project.get("name") == DISTRIBUTION else "unknown"


class VersionAction(argparse.Action):
    """`--version` / `-V`: print `tandem <version>` on stdout and exit 0; the version is looked up only then."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        # No value in the namespace (argparse names a dest `version`, and help would show its default).
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0,
                         help="print tandem's version and exit", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        sys.stdout.write(f"{parser.prog} {tandem_version()}\n")
        parser.exit(0)
