"""Named SSE events (`event: <type>` / `data: <json>`), as /v1/responses and /v1/messages stream them."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["named_events"]


def named_events(body: str) -> list[dict[str, Any]]:
    """The `event:` / `data:` pairs of a stream; fails on malformed framing or a `type` that differs from the event's
    name. Comments (keep-alives) are skipped."""
    events = []
    for block in body.split("\n\n"):
        if not block.strip() or block.startswith(":"):
            continue
        head, data = block.split("\n")
        assert head.startswith("event: ") and data.startswith("data: "), block
        event = json.loads(data[len("data: "):])
        assert event["type"] == head[len("event: "):]
        events.append(event)
    return events
