"""The Responses route tests' app and the openai SDK pointed at it, over each module's own `engine` fixture."""

from __future__ import annotations

from typing import Any, Iterator

import openai
import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.state import AppState
from tests.service.fake_engine import FakeEngine


@pytest.fixture
def http(engine: FakeEngine) -> Iterator[TestClient[Any]]:
    with TestClient(create_app(AppState(engine=engine))) as client:
        yield client


@pytest.fixture
def sdk(http: TestClient[Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{http.base_url}/v1", api_key="unused", http_client=http, max_retries=0)
