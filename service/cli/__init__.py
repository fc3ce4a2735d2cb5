"""`tandem` — the command line, one module per command; `main` is the console-script entry point."""

try:
    from service.cli.main import main
except KeyboardInterrupt:  # Ctrl-C while the commands' modules load (~1.5 s): exit 130 as main() does, no traceback
    raise SystemExit(130) from None

__all__ = ["main"]
