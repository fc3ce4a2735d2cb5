"""The /stats document: server facts, the limits it enforces, engine.stats() and speech stats."""

from __future__ import annotations

import os
import time
from typing import Any

from service.process.gc_pauses import GC_PAUSES
from service.state import AppState

__all__ = ["stats_payload", "limits_payload"]


def limits_payload(state: AppState) -> dict[str, Any]:
    """Every limit the server enforces, as configured (admission, deadlines, sizes, timeouts, auth).
    Keys are never shown, only how many there are. Raises nothing."""
    config = state.config
    return {
        "max_active": config.max_active,
        "max_queued": config.queue_limit,
        "max_tokens_cap": config.max_tokens_cap,
        "request_timeout": config.request_timeout,
        "shutdown_timeout": config.shutdown_timeout,
        "allow_request_templates": config.allow_request_templates,
        **config.limits.as_dict(),
        "api_keys": len(config.api_keys),
        "allowed_origins": list(config.allowed_origins),
    }


def stats_payload(state: AppState) -> dict[str, Any]:
    """The /stats document. Raises nothing."""
    payload: dict[str, Any] = {
        "model": state.chat_model_name,
        "uptime_s": round(time.time() - state.started_at, 3),
        "ready": state.ready,
        "phase": state.phase,
        "pid": os.getpid(),
        "limits": limits_payload(state),
        "gc": GC_PAUSES.snapshot(),
    }
    engine = state.engine
    if engine is not None:
        try:
            payload.update(engine.stats())
        except Exception as exc:  # stats are diagnostics: never fail the request over them
            payload["stats_error"] = str(exc)
    # Kept responses and their items (service/responses/item_cache.py): bounded apart from the memory budget.
    payload["responses_store"] = state.issued_items.stats()
    if state.speech is not None:
        try:
            payload["speech"] = state.speech.stats()
        except Exception as exc:  # noqa: BLE001 — as above
            payload["speech"] = {"error": str(exc)}
    return payload
