"""OpenAI's `prompt_cache_retention` (chat's field and the Responses API's): "in_memory" or "24h". The hyphenated
"in-memory" OpenAI first documented, which older SDKs send (the Agents SDK rewrites it), is the same value."""

from __future__ import annotations

from typing import Any, Literal

__all__ = ["CacheRetention", "retention_alias"]

CacheRetention = Literal["in_memory", "24h"]


def retention_alias(cls: Any, value: Any) -> Any:
    """A `prompt_cache_retention` validator (before parsing): "in-memory" is "in_memory". Raises nothing."""
    return "in_memory" if value == "in-memory" else value
