"""Driving one HTTP request at the ASGI level, for tests that must control when the client leaves."""

from __future__ import annotations

import json
from typing import Any

import anyio

from tests.service.conftest import sse_events

__all__ = ["asgi_scope", "ASGIClient"]


def asgi_scope(path: str) -> dict[str, Any]:
    """An HTTP POST scope for `path` with a JSON body."""
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
        "client": ("127.0.0.1", 1), "server": ("test", 80),
    }


class ASGIClient:
    """Sends `body`, collects the response body. `first` is set once a chunk holds `marker`; `leave` is set
    at the response's end, or by the test, and makes the next receive() report http.disconnect."""

    def __init__(self, body: dict[str, Any], marker: bytes = b"data: ") -> None:
        self.body = json.dumps(body).encode()
        self.marker = marker
        self.sent_body = False
        self.first = anyio.Event()
        self.leave = anyio.Event()
        self.chunks: list[bytes] = []

    async def receive(self) -> dict[str, Any]:
        if not self.sent_body:
            self.sent_body = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.leave.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            self.chunks.append(message.get("body", b""))
            if self.marker in message.get("body", b""):
                self.first.set()
            if not message.get("more_body", False):
                self.leave.set()

    def events(self) -> list[Any]:
        """The SSE events received."""
        return sse_events(b"".join(self.chunks).decode())
