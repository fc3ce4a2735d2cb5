"""Chat requests within limits: admission (429), deadlines (504), max_tokens cap, prompt rendering bounded
in time and size and stopped when the client leaves, per-key prefix-cache namespaces."""

from __future__ import annotations

import json
import threading
from typing import Any

import anyio
import pytest
from litestar.testing import TestClient

from engine.errors import QueueFull
from service.app import create_app
from service.config import ServiceConfig
from service.limits import Limits
from service.state import AppState
from tests.service.asgi import asgi_scope
from tests.service.conftest import sse_events
from tests.service.fake_engine import FakeEngine, FakeTokenizer

USER = [{"role": "user", "content": "hi"}]


class CountingTokenizer(FakeTokenizer):
    """Counts encodes and renders; `spin` makes rendering loop in Python until it is stopped."""

    def __init__(self) -> None:
        super().__init__()
        self.encodes = 0
        self.spin = False
        self.spinning = threading.Event()
        self.stopped = threading.Event()

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        self.encodes += 1
        return super().encode(text, **kwargs)

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: Any = None, **kwargs: Any) -> Any:
        if self.spin:
            self.spinning.set()
            try:
                while True:  # a template that never ends (a 30000 x 30000 loop, say)
                    pass
            finally:
                self.stopped.set()
        return super().apply_chat_template(messages, tools, **kwargs)


def _app(engine: FakeEngine, **config: Any) -> Any:
    return create_app(AppState(engine=engine, config=ServiceConfig(**config)))


def test_text_that_cannot_fit_is_refused_before_any_rendering_or_tokenizing() -> None:
    engine = FakeEngine(context_length=256)
    engine.tokenizer = CountingTokenizer()
    with TestClient(_app(engine)) as client:
        huge = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 2_000_000}]})
        assert huge.status_code == 400 and huge.json()["error"]["code"] == "context_length_exceeded"
        prompt = client.post("/v1/completions", json={"prompt": "y" * 2_000_000})
        assert prompt.status_code == 400 and prompt.json()["error"]["code"] == "context_length_exceeded"
    assert engine.tokenizer.template_calls == [] and engine.tokenizer.encodes == 0


def test_a_nine_megabyte_body_is_refused_unread() -> None:
    engine = FakeEngine()
    engine.tokenizer = CountingTokenizer()
    with TestClient(_app(engine)) as client:
        body = json.dumps({"messages": [{"role": "user", "content": "z" * 9_000_000}]})
        answer = client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "request_too_large"
    assert engine.tokenizer.template_calls == [] and engine.tokenizer.encodes == 0


def test_a_template_that_runs_too_long_is_stopped_and_the_tokenizer_is_free_again() -> None:
    engine = FakeEngine()
    tokenizer = engine.tokenizer = CountingTokenizer()
    tokenizer.spin = True
    with TestClient(_app(engine, limits=Limits(render_timeout=0.2))) as client:
        slow = client.post("/v1/chat/completions", json={"messages": USER})
        assert slow.status_code == 400 and slow.json()["error"]["code"] == "render_timeout"
        assert tokenizer.stopped.is_set()  # the rendering thread itself was stopped, not abandoned
        tokenizer.spin = False
        assert client.post("/v1/chat/completions", json={"messages": USER}).status_code == 200


@pytest.mark.anyio
async def test_rendering_stops_when_the_client_leaves() -> None:
    engine = FakeEngine()
    tokenizer = engine.tokenizer = CountingTokenizer()
    tokenizer.spin = True
    app = create_app(AppState(engine=engine, ready=True))
    body = json.dumps({"messages": USER}).encode()
    left = anyio.Event()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if not sent and not left.is_set():
            sent.append({})
            return {"type": "http.request", "body": body, "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async with anyio.create_task_group() as tg:
        tg.start_soon(app, asgi_scope("/v1/chat/completions"), receive, send)
        await anyio.to_thread.run_sync(tokenizer.spinning.wait)
        left.set()  # the client goes away while the template spins
    assert await anyio.to_thread.run_sync(tokenizer.stopped.wait, 30)
    assert engine.requests == []


def test_a_request_without_max_tokens_gets_the_cap(fake_engine: FakeEngine) -> None:
    fake_engine.context_length = 10_000
    with TestClient(_app(fake_engine, max_tokens_cap=77)) as client:
        assert client.post("/v1/chat/completions", json={"messages": USER}).status_code == 200
        assert client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 500}).status_code == 200
    capped, asked = fake_engine.requests
    assert (capped.max_tokens, capped.max_tokens_requested) == (77, False)
    assert (asked.max_tokens, asked.max_tokens_requested) == (500, True)


def test_past_max_queued_the_answer_is_429_with_retry_after(fake_engine: FakeEngine) -> None:
    def full(_: Any) -> Any:
        raise QueueFull("64 requests are already waiting", queued=64, limit=64)

    fake_engine.submit = full  # type: ignore[method-assign]
    with TestClient(_app(fake_engine)) as client:
        for stream in (False, True):
            refused = client.post("/v1/chat/completions", json={"messages": USER, "stream": stream})
            assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
            assert "x-should-retry" not in refused.headers  # retried once the queue has room
            error = refused.json()["error"]
            assert error["code"] == "queue_full" and error["type"] == "rate_limit_error"


def test_a_request_past_its_deadline_is_stopped_and_told(fake_engine: FakeEngine) -> None:
    fake_engine.gate = anyio.Event()  # every row stalls after its first piece, until the deadline
    with TestClient(_app(fake_engine, request_timeout=0.2)) as client:
        late = client.post("/v1/chat/completions", json={"messages": USER})
        assert late.status_code == 504 and late.json()["error"]["code"] == "request_timeout"
        assert late.headers["x-should-retry"] == "false"  # the SDKs retried it twice, each to its deadline
        events = sse_events(client.post("/v1/chat/completions", json={"messages": USER, "stream": True}).text)
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "request_timeout"
    assert fake_engine.active == set()  # both rows were cancelled


def test_each_api_key_gets_its_own_prefix_cache_namespace(fake_engine: FakeEngine) -> None:
    with TestClient(_app(fake_engine, api_keys=["alpha", "beta"])) as client:
        for key in ("alpha", "beta", "alpha"):
            assert client.post("/v1/chat/completions", json={"messages": USER},
                               headers={"authorization": f"Bearer {key}"}).status_code == 200
    first, second, third = (r.namespace for r in fake_engine.requests)
    assert first == third != second and "alpha" not in first and first.startswith("fake-model")
    with TestClient(_app(fake_engine)) as client:
        client.post("/v1/chat/completions", json={"messages": USER})
    assert fake_engine.requests[-1].namespace == "fake-model"  # no keys: one shared namespace


def test_stream_latencies_are_recorded(client: TestClient[Any]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    client.post("/v1/chat/completions", json={"messages": USER, "stream": True})
    samples = {s.name: s.value for f in text_string_to_metric_families(client.get("/metrics").text) for s in f.samples}
    assert samples["tandem_time_to_first_token_seconds_count"] == 1
    assert samples["tandem_inter_token_latency_seconds_count"] >= 1
    assert samples["tandem_queue_wait_seconds_count"] == 1
