"""`tandem benchmark` — runs the benchmarks in bench/ (each compares against its peer in the same run)."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from service.cli.errors import CLIError
from service.cli.parsers import HelpFormatter, common_options

__all__ = ["add_benchmark", "BENCHMARKS"]

# name → (module, entry function, what it measures)
BENCHMARKS = {
    "chat": ("bench.chat", "cli", "HTTP tokens/s, TTFT, ITL at 1/4/8 streams vs mlx-lm generate and mlx_lm.server"),
    "agent": ("bench.agent_turns", "main", "10-turn agent conversation: TTFT per turn, prefix cache vs cold"),
    "speech": ("bench.speech", "main", "tandem transcribe vs mlx_whisper.transcribe; session finish latency"),
    "live": ("bench.live_serve", "main", "live speech over the wire: first word and final after speech, 1/4/8/16 "
             "speakers, chat ITL beside live sessions, speakers beside a busy chat"),
    "serve": ("bench.serve", "cli", "HTTP load (c1/c8/c64/Poisson/c128/soak) vs mlx_lm.server: tok/s, TTFT, ITL, RSS"),
    "engine": ("bench.engine_compare", "main", "engine-level vs mlx-lm BatchGenerator on a random-init shape"),
}


class _Formatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown, and the description's list of benchmarks kept one per line."""


def add_benchmark(sub: Any) -> None:
    """Register `tandem benchmark NAME [options...]`. Raises nothing."""
    p = sub.add_parser("benchmark", help="measure against the peers (mlx-lm, mlx_lm.server, mlx_whisper)",
                       description="\n".join(f"{k}: {v[2]}" for k, v in BENCHMARKS.items()),
                       formatter_class=_Formatter, parents=[common_options()])
    p.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark (see the list above)")
    options = p.add_argument("options", nargs=argparse.REMAINDER, help="passed to the benchmark (see NAME --help)")
    # argparse counts a REMAINDER positional as required: with no NAME its usage error named "options" too.
    options.required = False
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    """Run the named benchmark. Raises CLIError for a model that is not there and, exit 1, for a server that does
    not answer (tracebacks before)."""
    from audio.errors import WhisperCheckpointError
    from engine.errors import ModelNotFound

    module, entry, _ = BENCHMARKS[args.name]
    try:
        return int(getattr(importlib.import_module(module), entry)(args.options) or 0)
    except ModelNotFound as exc:
        raise CLIError(f"no model: {exc}") from None
    except WhisperCheckpointError as exc:
        raise CLIError(str(exc)) from None
    except Exception as exc:
        if (unreachable := _unreachable(exc)) is None:
            raise
        raise CLIError(unreachable, code=1) from None


def _unreachable(exc: BaseException) -> str | None:
    """"cannot reach URL: why" when `exc` (or one inside its group: anyio task groups wrap them) is a connection
    that could not be made; None for any other error. Raises nothing."""
    import httpx

    if isinstance(exc, BaseExceptionGroup):
        return next((line for inner in exc.exceptions if (line := _unreachable(inner)) is not None), None)
    if not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        return None
    try:
        url = exc.request.url
        where = f"{url.scheme}://{url.netloc.decode()}"
    except RuntimeError:  # no request attached
        where = "the server"
    return f"cannot reach {where}: {exc or type(exc).__name__} (is the server running? --server names it)"
