"""A failing engine step through the real engine and the real app: before the first token a 5xx in OpenAI's
shape, after it an SSE error event then [DONE]; never a successful empty answer."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from litestar.testing import TestClient

from engine.runtime import Engine
from service.app import create_app
from service.state import AppState
from tests.service.conftest import sse_events


class FailingForward:
    """The group's runner, failing every forward from call `from_call` on."""

    def __init__(self, inner: Any, from_call: int) -> None:
        self.inner, self.from_call, self.calls = inner, from_call, 0

    def forward(self, segments: Any) -> Any:
        self.calls += 1
        if self.calls >= self.from_call:
            raise RuntimeError("There is no Stream(gpu, 0) in current thread.")
        return self.inner.forward(segments)


@pytest.fixture
def engine(tiny_loaded: Any) -> Engine:
    return Engine(tiny_loaded, max_active=4, max_iteration_tokens=64)


@pytest.fixture
def client(engine: Engine) -> Iterator[TestClient[Any]]:
    with TestClient(create_app(AppState(engine=engine))) as test_client:
        yield test_client


def chat(client: TestClient[Any], **body: Any) -> Any:
    return client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hello there"}],
                                                     "max_tokens": 8, **body})


def test_a_step_failing_before_the_first_token_is_a_500_streamed_or_not(client: Any, engine: Engine) -> None:
    engine.group.step.runner = FailingForward(engine.group.step.runner, 1)
    for stream in (True, False):
        response = chat(client, stream=stream)
        assert response.status_code == 500
        error = response.json()["error"]
        assert error["type"] == "server_error" and "no Stream(gpu, 0)" in error["message"]
        assert set(error) == {"message", "type", "param", "code"}


def test_a_step_failing_after_the_first_token_ends_the_stream_with_an_error_event(client: Any,
                                                                                   engine: Engine) -> None:
    engine.group.step.runner = FailingForward(engine.group.step.runner, 6)  # a few tokens out, then the failure
    response = chat(client, stream=True, temperature=0)
    assert response.status_code == 200
    events = sse_events(response.text)
    assert any(isinstance(e, dict) and e.get("choices") and e["choices"][0]["delta"].get("content")
               for e in events)
    assert events[-1] == "[DONE]" and "no Stream" in events[-2]["error"]["message"]
    assert not any(isinstance(e, dict) and e.get("choices") and e["choices"][0]["finish_reason"] for e in events)


def test_health_turns_failing_while_every_step_fails_and_recovers(client: Any, engine: Engine) -> None:
    real = engine.group.step.runner
    engine.group.step.runner = FailingForward(real, 1)
    for _ in range(3):
        assert chat(client, stream=True).status_code == 500
    health = client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "failing"
    engine.group.step.runner = real
    assert chat(client).status_code == 200
    assert client.get("/health").json()["status"] == "ok"


NESTING = {"type": "json_schema", "json_schema": {"name": "n", "schema": {
    "type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}}}


def test_a_grammar_failing_mid_reply_is_the_requests_fault(client: TestClient[Any]) -> None:
    # The schema's parser gives up a few tokens in: a 500 server_error said the server was at fault (and the
    # SDKs retried it); it is the request's grammar, named, and retrying the same would fail the same.
    body = {"messages": [{"role": "user", "content": "hi"}], "response_format": NESTING, "max_tokens": 60,
            "temperature": 0}
    reply = client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "response_format" and error["code"] == "schema_failed"
    assert "<state>" not in error["message"]
    assert reply.headers["x-should-retry"] == "false"
    streamed = client.post("/v1/chat/completions", json={**body, "stream": True})
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "schema_failed"
