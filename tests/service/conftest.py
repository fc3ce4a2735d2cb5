"""Service fixtures: an app around a scripted FakeEngine, served in-process by Litestar's TestClient."""

from __future__ import annotations

import json
from typing import Any, Iterator

import openai
import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.state import AppState
from tests.service.fake_engine import FakeEngine

__all__ = ["fake_engine", "client", "http", "sdk", "sse_events"]


@pytest.fixture
def fake_engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(fake_engine: FakeEngine) -> Iterator[TestClient[Any]]:
    app = create_app(AppState(engine=fake_engine))
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture
def http(engine: FakeEngine) -> Iterator[TestClient[Any]]:
    """The app around a module's own `engine` fixture (the Responses tests', the legacy functions')."""
    with TestClient(create_app(AppState(engine=engine))) as client:
        yield client


@pytest.fixture
def sdk(http: TestClient[Any]) -> openai.OpenAI:
    """The openai SDK pointed at `http`."""
    return openai.OpenAI(base_url=f"{http.base_url}/v1", api_key="unused", http_client=http, max_retries=0)


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
