"""`tandem` — the command line: serve, generate, models, openapi (others plug in via SUBCOMMANDS).

Each subcommand is a function that adds its parser and sets `func`; `func(args)` returns the exit code.
Expected failures (no model, bad input) print one clear line on stderr and exit non-zero, no traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable

from service.transcribe_cli import add_dictate, add_models_import, add_serve_speech_args, add_transcribe, configure_serve_speech

__all__ = ["main", "build_parser", "SUBCOMMANDS", "CLIError"]


class CLIError(Exception):
    """A failure to report as one line (exit code 2 unless given)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------- serve

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 10**3, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6, "mib": 1 << 20,
          "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40, "tb": 10**12, "tib": 1 << 40}


def byte_size(text: str) -> int:
    """'12GiB', '800M', '1.5G' or plain bytes → bytes. Raises argparse.ArgumentTypeError."""
    import re

    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 12GiB, 800M or a byte count)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])



def _add_serve(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI-compatible API (granian, one worker)")
    p.add_argument("model", nargs="?", default=None, help="local dir, .gguf file, HF repo id in the cache, or 'demo' (default)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--max-active", type=int, default=16, help="rows decoding at once (default 16)")
    p.add_argument("--max-iteration-tokens", type=int, default=512, help="token budget per iteration (default 512)")
    p.add_argument("--served-model-name", default=None, help="model id shown in /v1/models")
    p.add_argument("--prompt-cache-bytes", type=byte_size, default=None,
                   help="prefix-cache byte budget, e.g. 2GiB (0 disables; default: a quarter of the memory budget "
                        "left after the weights)")
    p.add_argument("--memory-budget", type=byte_size, default=None,
                   help="bytes for weights, KV, prefix cache and MLX's buffer cache, e.g. 12GiB (default: 60%% of "
                        "RAM on CPU, 85%% of GPU memory); requests whose KV never fits get a 400")
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=None,
                   help="run internal generations at start so kernels compile before clients wait (default: on a "
                        "GPU, off on CPU)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--shutdown-timeout", type=int, default=5,
                   help="seconds in-flight requests get to finish on Ctrl-C/SIGTERM (default 5)")
    add_serve_speech_args(p)
    p.set_defaults(func=_serve)


def serve_config(args: argparse.Namespace) -> Any:
    """ServiceConfig from parsed `serve` arguments (others extend it via config.extra). Raises CLIError."""
    from service.config import ServiceConfig

    if args.max_active < 1 or args.max_iteration_tokens < 1:
        raise CLIError("--max-active and --max-iteration-tokens must be >= 1")
    if args.prompt_cache_bytes is not None and args.prompt_cache_bytes < 0:
        raise CLIError("--prompt-cache-bytes must be >= 0")
    if not 0 < args.port < 65536:
        raise CLIError(f"--port must be in 1..65535, got {args.port}")
    return ServiceConfig(
        model=args.model,
        max_active=args.max_active,
        max_iteration_tokens=args.max_iteration_tokens,
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        prompt_cache_bytes=args.prompt_cache_bytes,
        memory_budget=args.memory_budget,
        warmup=args.warmup,
    )


def _resolve_or_fail(spec: str | None) -> Any:
    from engine.models import ModelNotFound, resolve_model

    try:
        return resolve_model(spec)
    except ModelNotFound as exc:
        raise CLIError(f"no model: {exc}") from None


def _check_port(host: str, port: int) -> None:
    """Raise CLIError when host:port cannot be bound (granian would fail later with a Rust backtrace)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise CLIError(f"cannot resolve --host {host!r}: {exc}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise CLIError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (is another server running?)") from None


def _serve(args: argparse.Namespace) -> int:
    from service.serve import serve

    config = serve_config(args)
    transcription_only = configure_serve_speech(args, config)  # a bad --whisper-model fails here, clearly
    if not transcription_only:
        source = _resolve_or_fail(config.model)  # fail fast with a clear message, before any worker starts
    _check_port(config.host, config.port)
    if not transcription_only:
        print(f"tandem: model {source.name} ({source.kind}: {source.path})", file=sys.stderr, flush=True)
    return serve(config, log_level=args.log_level, shutdown_timeout=args.shutdown_timeout)


# ---------------------------------------------------------------- generate


def _add_generate(sub: Any) -> None:
    p = sub.add_parser("generate", help="stream one chat reply to the terminal (no server)")
    p.add_argument("prompt")
    p.add_argument("--model", default=None)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--system", default=None, help="system prompt")
    p.set_defaults(func=_generate)


def _generate(args: argparse.Namespace) -> int:
    _resolve_or_fail(args.model)
    import anyio

    from engine.contracts import GenerationRequest, SamplingParams
    from engine.models import load_model
    from engine.runtime import Engine, generate_stream

    if args.max_tokens < 1:
        raise CLIError("--max-tokens must be >= 1")
    loaded = load_model(args.model)
    engine = Engine(loaded, max_active=1)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.prompt}
    ]
    tokenizer = engine.tokenizer
    if getattr(tokenizer, "has_chat_template", False):
        prompt = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    else:
        prompt = list(tokenizer.encode(args.prompt))
    room = max(1, min(args.max_tokens, (engine.context_length or 0) - len(prompt)))
    request = GenerationRequest(
        prompt_tokens=prompt,
        sampling=SamplingParams(temperature=args.temperature, seed=args.seed),
        max_tokens=room,
    )

    def show(delta: Any) -> None:
        sys.stdout.write(delta.text)
        sys.stdout.flush()

    start = time.perf_counter()
    try:
        result = anyio.run(generate_stream, engine, request, show)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    seconds = time.perf_counter() - start
    sys.stdout.write("\n")
    rate = result.completion_tokens / seconds if seconds > 0 else 0.0
    print(
        f"[{result.prompt_tokens} prompt + {result.completion_tokens} generated tokens in {seconds:.2f} s, "
        f"{rate:.1f} tok/s, finish: {result.finish_reason}]",
        file=sys.stderr,
    )
    return 0


# ---------------------------------------------------------------- models


def _add_models(sub: Any) -> None:
    p = sub.add_parser("models", help="list or download models (Hugging Face cache)")
    msub = p.add_subparsers(dest="models_command", required=True)
    ls = msub.add_parser("ls", help="models in the local Hugging Face cache")
    ls.set_defaults(func=_models_ls)
    get = msub.add_parser("get", help="download a model repo into the Hugging Face cache")
    get.add_argument("repo", help="org/name, or org/name/file.gguf")
    get.set_defaults(func=_models_get)
    # `models import` (speech) adds its parser here: MODELS_SUBCOMMANDS.
    for add in MODELS_SUBCOMMANDS:
        add(msub)


def _models_ls(_: argparse.Namespace) -> int:
    from engine.models import demo_model_path, hub_cache_dir, list_cached_models

    models = list_cached_models()
    if not models:
        print(f"no models in the Hugging Face cache ({hub_cache_dir()}); `tandem models get ORG/NAME` downloads one")
    for m in models:
        print(f"{m.repo_id:50s} {m.kind:8s} {m.size_bytes / 1e6:10.1f} MB  {m.path}")
    if (demo := demo_model_path()) is not None:
        print(f"{'demo (embedded)':50s} {'llm':8s} {demo.stat().st_size / 1e6:10.1f} MB  {demo}")
    return 0


def _models_get(args: argparse.Namespace) -> int:
    from engine.models import ModelDownloadError, ModelNotFound, download_model

    try:
        path = download_model(args.repo)
    except (ModelNotFound, ModelDownloadError) as exc:
        raise CLIError(str(exc), code=1) from None
    print(path)
    return 0


# ---------------------------------------------------------------- openapi


def _add_openapi(sub: Any) -> None:
    p = sub.add_parser("openapi", help="write openapi/openapi.json from the app (or --check it)")
    p.add_argument("--check", action="store_true", help="exit 1 when the committed file differs")
    p.add_argument("--output", default=None, help="path (default: openapi/openapi.json in the repo)")
    p.set_defaults(func=_openapi)


def _openapi(args: argparse.Namespace) -> int:
    from pathlib import Path

    from service.openapi_spec import SPEC_PATH, openapi_drift, write_openapi

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


# ---------------------------------------------------------------- wiring

def _add_benchmark(sub: Any) -> None:
    from service.benchmark_cli import add_benchmark

    add_benchmark(sub)


def _add_pi(sub: Any) -> None:
    from service.pi import add_pi_parser

    add_pi_parser(sub)


# Adders of top-level subcommands. Others plug in here with one line each:
# transcribe / dictate (audio), pi (service/pi.py), benchmark (bench).
SUBCOMMANDS: list[Callable[[Any], None]] = [
    _add_serve, _add_generate, _add_models, _add_openapi, _add_pi, add_transcribe, add_dictate, _add_benchmark,
]
# Adders under `tandem models` (e.g. `models import` for CTranslate2 Whisper checkpoints).
MODELS_SUBCOMMANDS: list[Callable[[Any], None]] = [add_models_import]


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser. Raises nothing."""
    parser = argparse.ArgumentParser(prog="tandem", description="Chat and speech on one cooperative MLX scheduler.")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `tandem` console script; returns the exit code. Raises SystemExit on --help."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pi"]:  # pi's own options (-p, --model...) pass through unparsed
        from service.pi import pi_command

        return pi_command(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CLIError as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
