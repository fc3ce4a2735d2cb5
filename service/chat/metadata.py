"""OpenAI's `metadata`, a request's tags: string pairs within OpenAI's limits. Without stored completions the one
place they can go is the request's access-log line (service/http/access_log.py), where operators find what a client
tagged; /v1/responses echoes them on the response too."""

from __future__ import annotations

from typing import Any

__all__ = ["metadata_limits", "MAX_PAIRS", "MAX_KEY", "MAX_VALUE"]

MAX_PAIRS = 16
MAX_KEY = 64
MAX_VALUE = 512


def metadata_limits(cls: Any, value: dict[str, str] | None) -> dict[str, str] | None:
    """A `metadata` validator: OpenAI's limits (pairs, key and value lengths). Raises ValueError naming the one
    broken."""
    limits = f"at most {MAX_PAIRS} pairs, keys of at most {MAX_KEY} characters and values of at most {MAX_VALUE}"
    if value and len(value) > MAX_PAIRS:
        raise ValueError(f"{len(value)} pairs; {limits}")
    for key, text in (value or {}).items():
        if len(key) > MAX_KEY:
            raise ValueError(f"key {key[:MAX_KEY]!r}… has {len(key)} characters; {limits}")
        if len(text) > MAX_VALUE:
            raise ValueError(f"the value of {key!r} has {len(text)} characters; {limits}")
    return value
