"""Run the API under granian (ASGI interface, one worker) around the app factory `service.app:app_from_env`.

The worker is a spawned process that builds the app from TANDEM_SERVE_CONFIG and loads the model in the
app's lifespan, so the parent never initialises MLX (no fork after MLX or BLAS threads exist).
"""

from __future__ import annotations

import logging
import multiprocessing
import os

from service.config import CONFIG_ENV, ServiceConfig

__all__ = ["serve", "APP_FACTORY"]

APP_FACTORY = "service.app:app_from_env"

_log = logging.getLogger("tandem.service")


def serve(config: ServiceConfig, *, shutdown_timeout: int = 5) -> int:
    """Serve until SIGINT/SIGTERM; returns the process exit code. In-flight requests get
    `shutdown_timeout` seconds to finish, then the worker is stopped (a long stream would otherwise hold
    shutdown for minutes). Raises granian's errors for invalid settings."""
    from granian import Granian
    from granian.constants import Interfaces
    from granian.log import LogLevels

    os.environ[CONFIG_ENV] = config.to_json()
    # A fresh interpreter for the worker: MLX and BLAS thread pools must not be inherited through fork.
    multiprocessing.set_start_method("spawn", force=True)
    _log.info("serving on http://%s:%d/v1 (granian, ASGI, 1 worker)", config.host, config.port)
    server = Granian(
        APP_FACTORY,
        address=config.host,
        port=config.port,
        interface=Interfaces.ASGI,
        workers=1,
        factory=True,
        log_level=LogLevels(config.log_level),
        # Our own access log (service/http/access_log.py) knows token counts; granian's would not.
        log_access=False,
        # Long SSE streams and slow model loads must not be cut by worker restarts.
        respawn_failed_workers=False,
        workers_kill_timeout=max(1, shutdown_timeout),
    )
    server.serve()
    return 0
