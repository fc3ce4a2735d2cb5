"""ServiceConfig — what `tandem serve` was asked for, passed to the granian worker through the environment.

granian builds the app in a worker process from an import path (`service.app:app_from_env`), so the
options travel as JSON in TANDEM_SERVE_CONFIG; single env vars (TANDEM_MODEL, ...) override it, which
lets `granian --interface asgi --factory service.app:app_from_env` be used directly.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from engine.pacing import DECODE_BURST, STALL
from service.limits import Limits

__all__ = ["ServiceConfig", "CONFIG_ENV", "API_KEY_ENV", "SSE_KEEPALIVE", "base_url", "split_list", "unbracketed"]

CONFIG_ENV = "TANDEM_SERVE_CONFIG"
# API keys, comma-separated (read by `tandem serve` and by the worker; --api-key adds to them).
API_KEY_ENV = "TANDEM_API_KEY"
# Seconds between the SSE comments a stream sends while its first token waits: clients with short read timeouts
# (httpx's 5 s) and proxies' idle timers would cut a queued stream otherwise.
SSE_KEEPALIVE = 2.0

# Single variables for an app started without the CLI (`granian service.app:app_from_env`): env name → (field,
# type). Under `tandem serve` the flags are the config (CONFIG_ENV): these were applied over them, so a leftover
# TANDEM_MAX_ACTIVE silently beat --max-active.
_OVERRIDES: dict[str, tuple[str, type]] = {
    "TANDEM_MODEL": ("model", str),
    "TANDEM_MAX_ACTIVE": ("max_active", int),
    "TANDEM_MAX_ITERATION_TOKENS": ("max_iteration_tokens", int),
    "TANDEM_PROMPT_CACHE_BYTES": ("prompt_cache_bytes", int),
    "TANDEM_MEMORY_BUDGET": ("memory_budget", int),
    "TANDEM_LOG_LEVEL": ("log_level", str),
    "TANDEM_LOG_FORMAT": ("log_format", str),
    "TANDEM_MAX_QUEUED": ("max_queued", int),
}


def unbracketed(host: str) -> str:
    """`host` without the brackets a URL puts around an IPv6 literal (`[::1]` → `::1`), what binding takes. Raises
    nothing."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def base_url(host: str, port: int, tls: bool = False) -> str:
    """http://host:port (https:// with `tls`), an IPv6 literal in brackets (RFC 3986: unbracketed, its colons read
    as the port's); a host already in brackets is kept as it is. Raises nothing."""
    bare = unbracketed(host)
    scheme = "https" if tls else "http"
    return f"{scheme}://[{bare}]:{port}" if ":" in bare else f"{scheme}://{bare}:{port}"


def split_list(values: str | list[str] | None) -> list[str]:
    """Comma-separated text (or a list of such texts) → the non-empty stripped items. Raises nothing."""
    if values is None:
        return []
    items = [values] if isinstance(values, str) else values
    return [part.strip() for item in items for part in item.split(",") if part.strip()]


@dataclass
class ServiceConfig:
    """Server options. Subsystems with their own options (speech, pi) keep them under `extra`."""

    model: str | None = None
    max_active: int = 16
    max_iteration_tokens: int = 512
    # A mixed iteration (decoding rows + a prompt chunk) may last this many decode-only iterations.
    prefill_stall: float = STALL
    # Decode steps the engine thread runs back to back while nothing else waits (1: one per loop turn).
    decode_burst: int = DECODE_BURST
    prompt_cache_bytes: int | None = None
    # Bytes for weights, KV, prefix cache and MLX's buffer cache; None: the machine's default.
    memory_budget: int | None = None
    # Run internal generations before serving so kernels compile first; None: on a GPU only.
    warmup: bool | None = None
    # The engine and its models in a supervised child process (service/isolate/): the API stays up
    # through an engine crash, and HTTP work never shares a GIL with the engine.
    isolate: bool = False
    # Freeze what startup built out of Python's collections at ready (service/process/gc_pauses.py); the CLI
    # turns it on. Off by default: a test process starts many apps and should not pin their objects.
    freeze_gc: bool = False
    # Python's collection thresholds from ready on (gc.set_threshold); None: Python's own (700, 10, 10).
    gc_thresholds: tuple[int, int, int] | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    # HTTPS and WSS on the port (granian's TLS): PEM certificate chain and its unencrypted private key; None: HTTP.
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    # Loaded-model name shown in /v1/models; default: what engine.model_name says.
    served_model_name: str | None = None
    # Level of our loggers (service/logs.py) and granian's in the worker.
    log_level: str = "info"
    # Their lines' format, granian's too: "text" or "json" (one object a line, for log collectors).
    log_format: str = "text"
    # Admission: queued rows beyond this are refused with 429 (None: 4 x max_active).
    max_queued: int | None = None
    # max_tokens given to chat requests that set none (the engine may lower it to fit its memory budget).
    max_tokens_cap: int = 4096
    # Seconds a generation may take from arrival to its last token (0: no deadline).
    request_timeout: float = 600.0
    # Seconds between keep-alives (`: keep-alive`, Anthropic's ping) while a stream sends nothing, before its first
    # token or after; 0: none (llmperf parses every non-blank line as JSON).
    sse_keepalive: float = SSE_KEEPALIVE
    # Seconds streams get to finish on SIGTERM before they are ended with an error event.
    shutdown_timeout: float = 5.0
    # Client-supplied chat templates (chat_template_kwargs.chat_template) are refused unless set.
    allow_request_templates: bool = False
    # A fine-tune's adapter directory (mlx_lm.lora's) applied to the chat model's weights at load.
    adapter_path: str | None = None
    # The chat model's template replaced (its text), and template variables every request gets unless it sets them.
    chat_template: str | None = None
    chat_template_args: dict[str, Any] = field(default_factory=dict)
    # Bearer / x-api-key keys; empty: no auth. Browser origins allowed for CORS and websockets.
    api_keys: list[str] = field(default_factory=list)
    allowed_origins: list[str] = field(default_factory=list)
    # Host names a keyless loopback server answers besides this machine's own (service/http/auth.py host_allowed).
    allowed_hosts: list[str] = field(default_factory=list)
    # Peers whose X-Forwarded-For names the client in the access log (service/http/forwarded.py): IPs, CIDRs or "*".
    forwarded_allow_ips: list[str] = field(default_factory=lambda: ["127.0.0.1"])
    limits: Limits = field(default_factory=Limits)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.limits, Mapping):  # from JSON
            self.limits = Limits.from_dict(self.limits)

    @property
    def tls(self) -> bool:
        """Whether the server speaks HTTPS / WSS. Raises nothing."""
        return self.ssl_certfile is not None and self.ssl_keyfile is not None

    @property
    def queue_limit(self) -> int:
        """Waiting requests allowed before 429s (max_queued, or 4 x max_active). Raises nothing."""
        return self.max_queued if self.max_queued is not None else 4 * self.max_active

    def to_json(self) -> str:
        """The config as JSON for CONFIG_ENV. Raises TypeError for values JSON cannot hold."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "ServiceConfig":
        """Read CONFIG_ENV (JSON, what `tandem serve` writes from its flags), or without it the single variables
        (_OVERRIDES). Unknown JSON keys are ignored.

        Raises ValueError for malformed JSON or a non-integer numeric override."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        if raw := env.get(CONFIG_ENV):
            try:
                loaded = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{CONFIG_ENV} is not valid JSON: {exc}") from exc
            known = {f.name for f in dataclasses.fields(cls)}
            values = {k: v for k, v in loaded.items() if k in known}
        for name, (key, kind) in _OVERRIDES.items() if not raw else ():
            if (raw_value := env.get(name)) not in (None, ""):
                try:
                    values[key] = kind(raw_value)
                except ValueError as exc:
                    raise ValueError(f"{name} must be {kind.__name__}, got {raw_value!r}") from exc
        # Keys from the environment join those of the config (the worker reads both).
        keys = split_list(values.get("api_keys")) + split_list(env.get(API_KEY_ENV))
        values["api_keys"] = list(dict.fromkeys(keys))
        return cls(**values)
