"""Run the API under granian (ASGI interface, one worker) around the app factory `service.app:app_from_env`.

The main process owns the listening socket and supervises the worker (service/process/supervisor.py): a
worker that dies is respawned with its models, and clients meanwhile wait at the port or get 503 with
Retry-After from the new worker while it loads. The worker is a spawned process that builds the app from
TANDEM_SERVE_CONFIG, so the parent never initialises MLX (no fork after MLX or BLAS threads exist).
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import resource
from pathlib import Path
from typing import Any

from service.config import CONFIG_ENV, ServiceConfig, base_url
from service.limits import Limits
from service.logs import granian_log_config
from service.process.cleanup import remove_interrupted_conversions
from service.process.parent import PARENT_PID_ENV

__all__ = ["serve", "APP_FACTORY", "raise_open_files_limit", "GRANIAN_WS_FRAME_BYTES", "ws_frame_warning"]

APP_FACTORY = "service.app:app_from_env"

# After the drain (shutdown_timeout), the worker's last events and lifespan get this long before a kill.
_KILL_MARGIN_SECONDS = 15

_log = logging.getLogger("tandem.service")

# Granian reads websockets with tungstenite's defaults and offers no setting (2.8.9): a frame over 16 MiB closes
# the connection before the app sees it, so no error event can answer it. Larger messages arrive only fragmented.
GRANIAN_WS_FRAME_BYTES = 16 << 20


def ws_frame_warning(limits: Limits) -> str | None:
    """What to tell the operator when `--max-ws-frame-bytes` promises more than granian carries in one frame.
    Raises nothing."""
    if limits.max_ws_frame_bytes <= GRANIAN_WS_FRAME_BYTES:
        return None
    return (f"--max-ws-frame-bytes {limits.max_ws_frame_bytes} is over granian's {GRANIAN_WS_FRAME_BYTES}-byte "
            "websocket frame: a larger message sent in one frame closes its connection with no error event")


def raise_open_files_limit(wanted: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE towards `wanted` (capped by the hard limit; children inherit
    it). Returns the soft limit now. Raises nothing."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        return int(soft)
    except (ValueError, OSError):
        return 1024


def serve(config: ServiceConfig) -> int:
    """Serve until SIGINT/SIGTERM; returns the process exit code (0 after a graceful stop). On a signal the
    worker drains for `config.shutdown_timeout` seconds (service/process/drain.py). Raises granian's errors
    for invalid settings and SystemExit(1) when the worker cannot start or keeps dying."""
    from granian.constants import HTTPModes, Interfaces, SSLProtocols
    from granian.http import HTTP1Settings
    from granian.log import LogLevels

    from service.process.supervisor import SupervisedGranian

    remove_interrupted_conversions()
    limits = config.limits
    if (warning := ws_frame_warning(limits)) is not None:
        _log.warning("%s", warning)
    # Every connection holds a descriptor; stalled clients must not exhaust them before the limit applies.
    files = raise_open_files_limit(limits.max_connections + 1024)
    connections = max(64, min(limits.max_connections, files - 256))
    os.environ[CONFIG_ENV] = config.to_json()
    os.environ[PARENT_PID_ENV] = str(os.getpid())
    # A fresh interpreter for the worker: MLX and BLAS thread pools must not be inherited through fork.
    multiprocessing.set_start_method("spawn", force=True)
    # "Starting": the worker loads the model after this (503 meanwhile); a failed load must not read as served.
    _log.info("starting on %s/v1 (granian, ASGI, 1 worker, up to %d connections; ready once the model "
              "loads)", base_url(config.host, config.port, config.tls), connections)
    # HTTPS: TLS 1.2 at least, Python's and uvicorn's floor (granian's own, 1.3, turns away older clients).
    tls: dict[str, Any] = ({"ssl_cert": Path(config.ssl_certfile), "ssl_key": Path(config.ssl_keyfile),
                            "ssl_protocol_min": SSLProtocols.tls12}
                           if config.ssl_certfile and config.ssl_keyfile else {})
    server = SupervisedGranian(
        APP_FACTORY,
        address=config.host,
        port=config.port,
        interface=Interfaces.ASGI,
        workers=1,
        factory=True,
        log_level=LogLevels(config.log_level),
        log_dictconfig=granian_log_config(config.log_format),  # stderr, beside ours, in our format
        # Our own access log (service/http/access_log.py) knows token counts; granian's would not.
        log_access=False,
        # Requests served at once: a stalled client holds one, so there must be many more than workers.
        backpressure=connections,
        backlog=max(1024, min(connections, 65535)),
        # HTTP/1 only: in "auto" mode granian sniffs the first bytes itself, so a connection that never sends one
        # was never timed out (2,000 of them took every descriptor). Now the header timeout also ends it, and
        # a kept-alive connection idle that long.
        http=HTTPModes.http1,
        http1_settings=HTTP1Settings(header_read_timeout=max(1, int(limits.header_timeout * 1000))),
        workers_kill_timeout=math.ceil(config.shutdown_timeout) + _KILL_MARGIN_SECONDS,
        **tls,
    )
    server.serve()
    return 0
