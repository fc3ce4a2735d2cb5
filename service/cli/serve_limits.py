"""The admission, limit and access flags of `tandem serve`: every limit of service/limits.py, the queue
bound, deadlines, API keys and browser origins."""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from service.cli.errors import CLIError
from service.cli.parsers import byte_size, seconds
from service.cli.serve_speech import mark_speech_only
from service.config import API_KEY_ENV, ServiceConfig, split_list
from service.http.auth import is_loopback
from service.http.forwarded import TrustedProxies
from service.http.guard import MIN_BODY_RATE
from service.limits import Limits

__all__ = ["add_serve_limit_args", "configure_serve_limits", "warn_if_open"]

_log = logging.getLogger("tandem.cli")

_DEFAULT = Limits()


def add_serve_limit_args(p: argparse.ArgumentParser) -> None:
    """Register the flags. Raises nothing."""
    a = p.add_argument_group("admission")
    a.add_argument("--max-queued", type=int, default=None,
                   help="requests that may wait for a free row; more are answered 429 with Retry-After (0: none "
                        "wait, a free row still serves) (default: 4 x --max-active)")
    a.add_argument("--max-tokens-cap", "--max-tokens", type=int, default=4096,  # mlx_lm.server's name too
                   help="max_tokens of chat requests that set none (the memory budget may lower it further)")
    a.add_argument("--request-timeout", type=seconds, default=600.0, metavar="SEC",
                   help="a generation still running this long after its request arrived is stopped and the "
                        "client gets a request_timeout error (0: no deadline)")
    a.add_argument("--allow-request-templates", action="store_true",
                   help="accept chat_template_kwargs.chat_template from clients (off: only the model's own "
                        "template is rendered)")
    a.add_argument("--chat-template", default=None, metavar="FILE_OR_TEXT",
                   help="replace the chat model's template (a Jinja file, or its text), e.g. for a base model or a "
                        "checkpoint whose template is broken (default: the model's own)")
    a.add_argument("--chat-template-args", default=None, metavar="JSON",
                   help="template variables every chat request gets unless it sets them, e.g. "
                        "'{\"enable_thinking\": false}' (default: none)")
    lim = p.add_argument_group("limits")
    lim.add_argument("--max-body-bytes", type=byte_size, default=_DEFAULT.max_body_bytes,
                     help="largest JSON request body, e.g. 8MiB")
    # These five reach only the speech routes (uploads, session audio, the live websockets).
    speech_only = [
        lim.add_argument("--max-upload-bytes", type=byte_size, default=_DEFAULT.max_upload_bytes,
                         help="largest multipart upload to /v1/audio/transcriptions"),
        lim.add_argument("--max-part-bytes", type=byte_size, default=_DEFAULT.max_part_bytes,
                         help="largest single part of a multipart upload"),
        lim.add_argument("--max-audio-seconds", type=seconds, default=_DEFAULT.max_audio_seconds, metavar="SEC",
                         help="longest audio one transcription request (or one file appended to a session) may hold; "
                              "longer is refused with a 400 audio_too_long"),
        lim.add_argument("--max-pcm-chunk-bytes", type=byte_size, default=_DEFAULT.max_pcm_chunk_bytes,
                         help="largest audio chunk appended to a live session"),
        lim.add_argument("--max-ws-frame-bytes", type=byte_size, default=_DEFAULT.max_ws_frame_bytes,
                         help="largest websocket message (default 16MiB: OpenAI's 15 MiB Realtime append fits, and "
                              "granian itself drops a connection on a single frame over 16 MiB); a bigger fragmented "
                              "one is dropped with an error event, the session and its audio stay"),
    ]
    mark_speech_only(p, *speech_only)
    lim.add_argument("--header-timeout", type=seconds, default=_DEFAULT.header_timeout, metavar="SEC",
                     help="seconds a connection has to send its request headers, and so also how long an idle "
                          "keep-alive connection stays open between requests (granian has no separate idle "
                          "timeout): behind a reverse proxy that keeps upstream connections open (nginx's upstream "
                          "keepalive, a load balancer), set its upstream idle timeout below this (nginx: "
                          "keepalive_timeout in the upstream block) or raise this, else it reuses a connection the "
                          "server has just closed and answers 502")
    lim.add_argument("--body-timeout", type=seconds, default=_DEFAULT.body_timeout, metavar="SEC",
                     help=f"seconds a request body may send nothing before the request is answered 408; after "
                          f"them a body still arriving must have come at {MIN_BODY_RATE} bytes/s on average beyond "
                          f"them (a slower one is answered 408 even while bytes keep arriving)")
    lim.add_argument("--send-timeout", type=seconds, default=_DEFAULT.send_timeout, metavar="SEC",
                     help="seconds a streamed response may wait for its client to read before it is ended and its "
                          "generation stopped")
    lim.add_argument("--max-json-depth", type=int, default=_DEFAULT.max_json_depth,
                     help="deepest array/object nesting accepted in a JSON body")
    lim.add_argument("--render-timeout", type=seconds, default=_DEFAULT.render_timeout, metavar="SEC",
                     help="seconds the chat template may take to render one request")
    lim.add_argument("--max-connections", type=int, default=_DEFAULT.max_connections,
                     help="connections served at once; more wait in the listen backlog")
    acc = p.add_argument_group("access")
    acc.add_argument("--api-key", action="append", default=None,
                     help=f"require this key (Authorization: Bearer or x-api-key) on every route but /health; "
                          f"repeat or comma-separate for several; {API_KEY_ENV} adds more (default: no key)")
    acc.add_argument("--allowed-origins", action="append", default=None,
                     help="browser origins allowed to call the server (CORS and websocket Origin), comma-"
                          "separated, '*' for any, 'null' for sandboxed or file:// pages (default: none; requests "
                          "from other origins get 403)")
    acc.add_argument("--allowed-hosts", action="append", default=None,
                     help="Host names a keyless server on a loopback address answers besides this machine's own "
                          "(localhost, loopback and private addresses, *.localhost, *.local, *.internal, its "
                          "hostname), comma-separated, '*' for any: e.g. the name a local reverse proxy forwards. "
                          "Others get 403, so a page re-pointing its domain at 127.0.0.1 cannot use the server "
                          "(default: none)")
    acc.add_argument("--forwarded-allow-ips", action="append", default=None,
                     help="peers (a reverse proxy) whose X-Forwarded-For names the client on the access-log line "
                          "('from CLIENT via PROXY'), as uvicorn's flag: IP addresses or networks, comma-separated, "
                          "'*' for any; the header of any other peer is ignored (default: 127.0.0.1)")


def configure_serve_limits(args: argparse.Namespace, config: ServiceConfig) -> None:
    """Copy the flags into `config`, checked. Raises CLIError naming a flag whose value cannot work."""
    if args.max_queued is not None and args.max_queued < 0:
        raise CLIError("--max-queued must be >= 0")
    if args.api_key is not None and any(not split_list(value) for value in args.api_key):
        raise CLIError("--api-key is empty (an unset variable?): give a key, or leave --api-key out to serve "
                       "without one")
    env_keys = os.environ.get(API_KEY_ENV) or ""
    if env_keys.strip() and not split_list(env_keys):  # " , " left the server open with no word
        raise CLIError(f"{API_KEY_ENV} holds no key ({env_keys!r}): give a key, or unset it to serve without one")
    if args.max_tokens_cap < 1:
        raise CLIError("--max-tokens-cap must be >= 1")
    if args.request_timeout < 0:
        raise CLIError("--request-timeout must be >= 0 (0: no deadline)")
    limits = Limits(
        max_body_bytes=args.max_body_bytes, max_upload_bytes=args.max_upload_bytes,
        max_part_bytes=args.max_part_bytes, max_audio_seconds=args.max_audio_seconds,
        max_pcm_chunk_bytes=args.max_pcm_chunk_bytes,
        max_ws_frame_bytes=args.max_ws_frame_bytes, header_timeout=args.header_timeout,
        body_timeout=args.body_timeout, send_timeout=args.send_timeout, max_json_depth=args.max_json_depth,
        render_timeout=args.render_timeout,
        max_connections=args.max_connections)
    try:
        limits.check()
    except ValueError as exc:
        raise CLIError(f"--{str(exc).split(' ', 1)[0].replace('_', '-')} must be > 0") from None
    config.max_queued = args.max_queued
    config.max_tokens_cap = args.max_tokens_cap
    config.request_timeout = args.request_timeout
    config.allow_request_templates = args.allow_request_templates
    config.chat_template = _template_text(args.chat_template)
    config.chat_template_args = _template_args(args.chat_template_args)
    config.limits = limits
    config.api_keys = list(dict.fromkeys(split_list(args.api_key) + split_list(os.environ.get(API_KEY_ENV))))
    config.allowed_origins = [_origin(o) for o in split_list(args.allowed_origins)]
    config.allowed_hosts = split_list(args.allowed_hosts)
    if args.forwarded_allow_ips is not None:
        config.forwarded_allow_ips = split_list(args.forwarded_allow_ips)
        try:
            TrustedProxies(config.forwarded_allow_ips)
        except ValueError as exc:
            raise CLIError(f"--forwarded-allow-ips: {exc}") from None


def _origin(value: str) -> str:
    """An --allowed-origins entry as browsers send an Origin: without the trailing slash an address bar shows (CORS
    compares exactly: the slash let websockets in and failed every fetch). Raises CLIError for a path or no
    scheme."""
    if value in ("*", "null"):  # null: a sandboxed or file:// page (and some desktop webviews), only when listed
        return value
    origin = value.rstrip("/")
    parts = urlsplit(origin)
    if not parts.scheme or not parts.netloc or parts.path or parts.query or parts.fragment:
        raise CLIError(f"--allowed-origins: {value!r} is not an origin (scheme://host[:port], as a browser sends it, "
                       f"e.g. http://localhost:3000)")
    return origin


def warn_if_open(config: ServiceConfig) -> None:
    """Warn when the server is reachable from other machines without a key (once the address is known to
    work: a bad --host is one error line, not a warning first). Raises nothing."""
    if not config.api_keys and not is_loopback(config.host):
        _log.warning("listening on %s without an API key: anyone who can reach this address can use the server "
                     "(set --api-key or %s)", config.host, API_KEY_ENV)


def _template_text(value: str | None) -> str | None:
    """--chat-template: a file's text, or the value itself when it names no file. Raises CLIError (empty,
    unreadable)."""
    if value is None:
        return None
    if not value.strip():  # before the path: --chat-template= was read as the current folder
        raise CLIError("--chat-template is empty")
    path = Path(value).expanduser()
    if "{" not in value and path.exists():
        try:
            value = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise CLIError(f"--chat-template: cannot read {path}: {exc}") from None
    elif "{{" not in value and "{%" not in value:
        # neither a file nor Jinja: a mistyped path, which rendered itself as every prompt
        raise CLIError(f"--chat-template: no such file {value!r}, and as a template it has no {{{{ }}}} or {{% %}}")
    if not value.strip():
        raise CLIError("--chat-template is empty")
    return value


def _template_args(value: str | None) -> dict[str, Any]:
    """--chat-template-args: a JSON object of template variables. Raises CLIError naming what is wrong."""
    if value is None:
        return {}
    try:
        args = json.loads(value)
    except json.JSONDecodeError as exc:
        raise CLIError(f"--chat-template-args is not JSON: {exc}") from None
    if not isinstance(args, dict):
        raise CLIError("--chat-template-args must be a JSON object of template variables")
    from service.chat.render import RESERVED_KWARGS, TEMPLATE_KWARGS

    for key in args:
        if key in RESERVED_KWARGS or key in TEMPLATE_KWARGS:
            raise CLIError(f"--chat-template-args: {key} is not a template variable"
                           + (" (give the template with --chat-template)" if key in TEMPLATE_KWARGS else ""))
    return args
