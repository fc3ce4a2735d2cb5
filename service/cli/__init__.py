"""`tandem` — the command line, one module per command; `main` is the console-script entry point."""

from service.cli.main import main

__all__ = ["main"]
