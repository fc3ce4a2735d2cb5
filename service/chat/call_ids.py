"""Tool-call ids in the shape a chat template insists on.

Mistral's templates (7B v0.3, Nemo, Small 3.x) refuse any id that is not nine alphanumerics ("Tool call IDs should
be alphanumeric strings with length 9!"), so an agent's second turn failed with the `call_` + 24 hex ids this server
(and OpenAI) issue. For such a template each id is mapped onto nine alphanumerics, the same way every turn (the
prefix cache sees the same text), and a call and its result keep matching. vLLM gives Mistral models such ids too.
"""

from __future__ import annotations

import hashlib
import string
from typing import Any, Collection

__all__ = ["wants_nine_char_ids", "nine_char_id", "with_nine_char_ids"]

_ASK = "alphanumeric strings with length 9"
_ALPHABET = string.ascii_letters + string.digits


def wants_nine_char_ids(template_sources: Collection[str] | None) -> bool:
    """True for a chat template that refuses tool-call ids other than nine alphanumerics. Raises nothing."""
    return any(_ASK in text for text in template_sources or ())


def nine_char_id(call_id: str) -> str:
    """`call_id` itself when it is nine ASCII alphanumerics, else nine drawn from its SHA-256. Raises nothing."""
    if len(call_id) == 9 and call_id.isascii() and call_id.isalnum():
        return call_id
    n = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    out = []
    for _ in range(9):
        n, digit = divmod(n, len(_ALPHABET))
        out.append(_ALPHABET[digit])
    return "".join(out)


def with_nine_char_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The template messages with every call's `id` and every result's `tool_call_id` as `nine_char_id`s (copies;
    the input is not changed). Raises nothing."""
    out: list[dict[str, Any]] = []
    for message in messages:
        item = dict(message)
        if isinstance(item.get("tool_call_id"), str):
            item["tool_call_id"] = nine_char_id(item["tool_call_id"])
        if item.get("tool_calls"):
            item["tool_calls"] = [{**call, "id": nine_char_id(call["id"])} if isinstance(call.get("id"), str)
                                  else call for call in item["tool_calls"]]
        out.append(item)
    return out
