"""JSON bodies with a nesting limit: a small body nested a thousand deep is a 400 naming the limit, checked
before the decoder recurses into it (msgspec raises RecursionError around depth 1,000)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from litestar import Request

from service.http.errors import APIError

__all__ = ["json_depth", "DepthLimitedRequest", "MAX_JSON_DEPTH_KEY"]

# Where the app factory leaves the limit (Litestar's app.state); the request class reads it.
MAX_JSON_DEPTH_KEY = "tandem.max_json_depth"

# A JSON string literal (escapes included), written so the regex engine never backtracks inside it.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_OPEN = np.frombuffer(b"[{", dtype=np.uint8)
_CLOSE = np.frombuffer(b"]}", dtype=np.uint8)


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
