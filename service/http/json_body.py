"""JSON bodies with a nesting limit: a small body nested a thousand deep is a 400 naming the limit, checked
before the decoder recurses into it (msgspec raises RecursionError around depth 1,000). A string holding an unpaired
surrogate escape (a JS client cutting text mid-emoji sends `"\\ud83d"`) is a 400 saying so, naming its field: msgspec
said "Input data was truncated"."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
from litestar import Request
from litestar.exceptions import SerializationException

from service.http.errors import APIError

__all__ = ["json_depth", "DepthLimitedRequest", "MAX_JSON_DEPTH_KEY"]

# Where the app factory leaves the limit (Litestar's app.state); the request class reads it.
MAX_JSON_DEPTH_KEY = "tandem.max_json_depth"

# A JSON string literal (escapes included), written so the regex engine never backtracks inside it.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_OPEN = np.frombuffer(b"[{", dtype=np.uint8)
_CLOSE = np.frombuffer(b"]}", dtype=np.uint8)
# A UTF-16 surrogate: in a decoded str, one that an escape left unpaired (a paired one decodes to its character).
_SURROGATE = re.compile("[\ud800-\udfff]")


def json_depth(body: bytes) -> int:
    """Deepest array/object nesting in a JSON text (brackets inside strings ignored); malformed text gives
    some number, and the decoder reports it afterwards. Raises nothing."""
    structure = np.frombuffer(_STRING.sub(b"", body), dtype=np.uint8)
    if structure.size == 0:
        return 0
    steps = np.isin(structure, _OPEN).astype(np.int32) - np.isin(structure, _CLOSE).astype(np.int32)
    return int(np.cumsum(steps).max(initial=0))


class DepthLimitedRequest(Request[Any, Any, Any]):
    """Litestar's Request, whose JSON body is refused (400 json_too_deep) when nested too deeply."""

    async def json(self) -> Any:
        """The decoded body. Raises APIError 400 when it nests deeper than the app's limit."""
        limit = self.app.state.get(MAX_JSON_DEPTH_KEY)
        if limit is not None:
            body = await self.body()
            if (depth := json_depth(body)) > limit:
                raise APIError(400, f"The JSON body nests {depth} levels deep; at most {limit} are accepted.",
                               code="json_too_deep")
        try:
            return await super().json()
        except RecursionError:  # a decoder limit below ours: still the client's body, still a 400
            raise APIError(400, "The JSON body nests too deeply to decode.", code="json_too_deep") from None
        except SerializationException:
            if (found := lone_surrogate(await self.body())) is not None:
                path, char = found
                where = f"the string at {path}" if path else "a string"
                raise APIError(400, f"We could not parse the JSON body of your request: {where} holds an unpaired "
                                    f"surrogate (\\u{ord(char):04x}), which is not valid Unicode (text cut in the "
                                    "middle of a character?).", param=path, code="invalid_json") from None
            raise


def lone_surrogate(body: bytes) -> tuple[str | None, str] | None:
    """Where the first string holding an unpaired surrogate escape is in a JSON text, as a dotted path (a key's: its
    object's; None: the top level), and the surrogate; None when the text holds none, or is no JSON. For the error
    path only (Python's decoder takes such escapes, msgspec refuses them). Raises nothing."""
    if b"\\u" not in body:
        return None
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    stack: list[tuple[str | None, Any]] = [(None, value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if (char := _surrogate(item)) is not None:
                return path, char
        elif isinstance(item, dict):
            if (char := next(filter(None, map(_surrogate, item)), None)) is not None:
                return path, char
            stack.extend((f"{path}.{key}" if path else key, child) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((f"{path}.{i}" if path else str(i), child) for i, child in reversed(list(enumerate(item))))
    return None


def _surrogate(text: str) -> str | None:
    return match.group() if (match := _SURROGATE.search(text)) is not None else None
