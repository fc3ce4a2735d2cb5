"""`tandem serve [MODEL]`: the OpenAI-compatible API under granian, one worker."""

from __future__ import annotations

import argparse
import math
import logging
import sys
from typing import Any

from engine.pacing import DECODE_BURST, STALL
from service.cli.errors import CLIError
from service.cli.parsers import add_command, byte_size, finite, gc_thresholds, seconds
from service.cli.resolve import resolve_adapter, resolve_chat_model
from service.cli.serve_checks import check_chat_model
from service.cli.serve_limits import add_serve_limit_args, configure_serve_limits, warn_if_open
from service.cli.serve_port import claim_port
from service.cli.serve_speech import add_serve_speech_args, configure_serve_speech
from service.cli.serve_tls import add_serve_tls_args, configure_serve_tls
from service.config import SSE_KEEPALIVE, ServiceConfig, base_url, unbracketed
from service.logs import notice

__all__ = ["add_serve", "serve_config"]

_log = logging.getLogger("tandem.cli")

# A keep-alive each millisecond outnumbered a tool reply's tokens 50 to 1 (~1 MB of Responses in_progress events).
MIN_KEEPALIVE = 0.5


def _keepalive_seconds(text: str) -> float:
    """--sse-keepalive: 0 (none) or at least MIN_KEEPALIVE seconds. Raises argparse.ArgumentTypeError."""
    value = seconds(text)
    if 0 < value < MIN_KEEPALIVE:
        raise argparse.ArgumentTypeError(f"0 (none) or at least {MIN_KEEPALIVE:g} seconds: {text!r}")
    return value


def add_serve(sub: Any) -> None:
    """Register `tandem serve`. Raises nothing."""
    p = add_command(sub, "serve", "serve the OpenAI-compatible API (granian, one worker)")
    p.add_argument("model", nargs="?", default=None,
                   help="chat model: local HF-layout dir, .gguf file, HF repo id in the local cache, or 'demo'; a "
                        "Whisper checkpoint serves transcription only (default: the embedded demo, "
                        "SmolLM2-135M-Instruct)")
    # mlx_lm.server's spelling: `--model DIR`
    p.add_argument("--model", dest="model_flag", default=None, metavar="MODEL",
                   help="the chat model, as the positional MODEL (default: the embedded demo)")
    p.add_argument("--adapter-path", default=None, metavar="DIR",
                   help="a fine-tune's adapter folder as mlx_lm.lora writes it (adapter_config.json, "
                        "adapters.safetensors), applied to the chat model: fused into float weights, live LoRA "
                        "layers on a quantized model (mlx_lm.server's flag) (default: none)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8080,
                   help="port to listen on (default: 8080); 0: a free one, chosen at start and named in the "
                        "`starting on` line")
    p.add_argument("--max-active", type=int, default=16, help="rows decoding at once")
    p.add_argument("--max-iteration-tokens", type=int, default=512, help="token budget per scheduler iteration")
    p.add_argument("--prefill-stall", type=finite, default=STALL, metavar="X",
                   help="while rows decode, an iteration carrying a prompt chunk may last X decode-only iterations "
                        "(the prompt chunk is sized from measured costs; larger X: faster prompts, longer token gaps)")
    p.add_argument("--decode-burst", type=int, default=DECODE_BURST, metavar="N",
                   help="decode steps the engine thread may run back to back, each one's tokens streamed while the "
                        "next runs, as long as no request, speech step or cancel waits (1: hand every step back to "
                        "the event loop)")
    p.add_argument("--served-model-name", default=None, help="model id shown in /v1/models (default: the model's name)")
    p.add_argument("--prompt-cache-bytes", type=byte_size, default=None,
                   help="prefix-cache byte budget, e.g. 2GiB; 0 disables (default: a quarter of the memory budget "
                        "left after the weights)")
    p.add_argument("--memory-budget", type=byte_size, default=None,
                   help="bytes for weights, KV, prefix cache and MLX's buffer cache, e.g. 12GiB (default: 60%% of "
                        "RAM on CPU, 85%% of GPU memory); a request whose KV can never fit gets a 400")
    p.add_argument("--isolate", action="store_true",
                   help="run the engine and its model in a child process this server supervises: the API and /health "
                        "stay up through an engine crash (it is restarted) and HTTP work never shares the engine's "
                        "GIL; Whisper runs there too")
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=None,
                   help="run internal generations and transcriptions at start so kernels compile before clients "
                        "wait: a kernel compiled while serving stalls every stream (default: on a GPU, off on CPU)")
    p.add_argument("--gc-freeze", action=argparse.BooleanOptionalAction, default=True,
                   help="at ready, move what startup built out of Python's garbage collections, whose full passes "
                        "over it pause every stream (default: on)")
    p.add_argument("--gc-thresholds", type=gc_thresholds, default=None, metavar="N[,N1[,N2]]",
                   help="Python's collection thresholds while serving (gc.set_threshold): allocations between young "
                        "collections, then young collections per older one; fewer, larger collections pause the "
                        "streams less often (default: Python's 700,10,10)")
    p.add_argument("--shutdown-timeout", type=seconds, default=5.0,
                   help="seconds streams get to finish on Ctrl-C/SIGTERM before they end with an error event")
    p.add_argument("--sse-keepalive", type=_keepalive_seconds, default=SSE_KEEPALIVE, metavar="SEC",
                   help="while a stream sends nothing (its first token waits, or later), send an SSE comment "
                        "(`: keep-alive`; on /v1/messages a ping, on /v1/responses an in_progress event) this often, "
                        "so read timeouts and proxies do not cut it; 0: none, for clients that parse every line as an "
                        f"event (llmperf); else at least {MIN_KEEPALIVE:g}")
    add_serve_limit_args(p)
    add_serve_tls_args(p)
    add_serve_speech_args(p)
    p.set_defaults(func=_serve)


def serve_config(args: argparse.Namespace) -> ServiceConfig:
    """ServiceConfig from parsed `serve` arguments (others extend it via config.extra). Raises CLIError."""
    if not 1 < args.prefill_stall < math.inf:
        raise CLIError(f"--prefill-stall must be a finite number > 1, got {args.prefill_stall}")
    if args.max_active < 1 or args.max_iteration_tokens < 1 or args.decode_burst < 1:
        raise CLIError("--max-active, --max-iteration-tokens and --decode-burst must be >= 1")
    if args.prompt_cache_bytes is not None and args.prompt_cache_bytes < 0:
        raise CLIError("--prompt-cache-bytes must be >= 0")
    if not 0 <= args.port < 65536:
        raise CLIError(f"--port must be in 0..65535 (0: a free port), got {args.port}")
    if args.shutdown_timeout < 0:
        raise CLIError("--shutdown-timeout must be >= 0")
    if args.model_flag is not None:
        if args.model is not None and args.model != args.model_flag:
            raise CLIError(f"two chat models given: {args.model!r} and --model {args.model_flag!r}")
        args.model = args.model_flag
    config = ServiceConfig(
        model=args.model,
        adapter_path=resolve_adapter(args.adapter_path),
        max_active=args.max_active,
        max_iteration_tokens=args.max_iteration_tokens,
        prefill_stall=args.prefill_stall,
        decode_burst=args.decode_burst,
        host=unbracketed(args.host),  # `[::1]`, as URLs write it, is the address inside
        port=args.port,
        served_model_name=args.served_model_name,
        prompt_cache_bytes=args.prompt_cache_bytes,
        memory_budget=args.memory_budget,
        warmup=args.warmup,
        isolate=args.isolate,
        freeze_gc=args.gc_freeze,
        gc_thresholds=args.gc_thresholds,
        log_level=args.log_level,
        log_format=args.log_format,
        shutdown_timeout=args.shutdown_timeout,
        sse_keepalive=args.sse_keepalive,
    )
    configure_serve_limits(args, config)
    configure_serve_tls(args, config)
    return config


def _serve(args: argparse.Namespace) -> int:
    from service.server import serve

    config = serve_config(args)
    speech = configure_serve_speech(args, config)  # a bad --whisper-model fails here, clearly
    if speech.transcription_only and config.adapter_path is not None:
        raise CLIError("--adapter-path applies to a chat model; this server serves transcription only")
    source = None if speech.transcription_only else resolve_chat_model(config.model)  # before any worker
    if source is not None:
        check_chat_model(source, config.memory_budget, max_iteration_tokens=config.max_iteration_tokens,
                         max_active=config.max_active)  # headers and sizes: one line, not a worker that fails
    from engine.accelerator import compiler_problem

    if (problem := compiler_problem()) is not None:  # else ready, then a 500 for every request
        raise CLIError(problem, code=1)
    claim = claim_port(config.host, config.port)
    config.port = claim.port  # --port 0: the port chosen, which the worker binds and the lines below name
    address = claim.address
    if address != config.host:
        # granian takes IP addresses only ("localhost" failed with a traceback); the Host guard and the warning
        # below judge the address actually bound, so `localhost` stays loopback.
        _log.info("--host %s resolves to %s", config.host, address)
        config.host = address
    # Only once every check passed, so a bad name or a busy port is the one line printed.
    warn_if_open(config)
    if not logging.getLogger("tandem.service").isEnabledFor(logging.INFO):
        # The info line that names the address is not shown at this level; the address always is. "Starting":
        # the model loads after this, and a load that fails must not follow a claim that the server is serving.
        url = base_url(config.host, config.port, config.tls)
        if config.log_format == "json":  # every stderr line a JSON object
            notice(_log, f"starting on {url}/v1 (ready once the model loads)")
        else:
            print(f"tandem serve: starting on {url}/v1 (ready once the model loads)", file=sys.stderr, flush=True)
    if source is not None:
        _log.info("model %s (%s: %s)", source.name, source.kind, source.path)
    _log.info("%s", speech.note)
    try:
        return serve(config)
    finally:
        claim.release()
