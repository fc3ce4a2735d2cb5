"""Service fixtures: an app around a scripted FakeEngine, served in-process by Litestar's TestClient."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.state import AppState
from tests.service.fake_engine import FakeEngine

__all__ = ["fake_engine", "client", "sse_events"]


@pytest.fixture
def fake_engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(fake_engine: FakeEngine) -> Iterator[TestClient[Any]]:
    app = create_app(AppState(engine=fake_engine))
    with TestClient(app) as test_client:
        yield test_client


def sse_events(body: str) -> list[Any]:
    """Parse an SSE body into JSON payloads, with "[DONE]" kept as the string; comments (keep-alives) skipped.
    Fails on malformed framing."""
    events: list[Any] = []
    for block in body.split("\n\n"):
        if not block.strip() or block.startswith(":"):
            continue
        assert block.startswith("data: "), f"not an SSE data event: {block!r}"
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
