"""The /stats document (server facts plus engine.stats()) and the same numbers as Prometheus gauges."""

from __future__ import annotations

import math
import re
import time
from typing import Any

from service.state import AppState

__all__ = ["stats_payload", "prometheus_text"]


def stats_payload(state: AppState) -> dict[str, Any]:
    """The /stats document: server facts plus engine.stats(). Raises nothing."""
    payload: dict[str, Any] = {
        "model": state.chat_model_name,
        "uptime_s": round(time.time() - state.started_at, 3),
        "ready": state.ready,
    }
    engine = state.engine
    if engine is not None:
        try:
            payload.update(engine.stats())
        except Exception as exc:  # stats are diagnostics: never fail the request over them
            payload["stats_error"] = str(exc)
    return payload


def _flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, bool):
        out[prefix] = float(value)
    elif isinstance(value, (int, float)) and math.isfinite(value):
        out[prefix] = float(value)
    elif isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{prefix}_{key}", inner, out)


def prometheus_text(payload: dict[str, Any]) -> str:
    """Numeric leaves of the stats document as Prometheus gauges named tandem_<path>. Raises nothing."""
    values: dict[str, float] = {}
    for key, value in payload.items():
        _flatten(key, value, values)
    lines = []
    for key, value in sorted(values.items()):
        name = "tandem_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)
        lines.append(f"# TYPE {name} gauge")
        lines.append(f"{name} {value:g}")
    return "\n".join(lines) + "\n"
