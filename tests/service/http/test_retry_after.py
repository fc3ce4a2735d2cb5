"""Retry-After of a 429 queue_full: when the queue, full now, has room again, from the recent requests' durations —
on every route that queues generations, where it was always 1 s (the SDKs' two retries spent in ~2 s)."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import TestClient

from engine.errors import QueueFull
from service.app import create_app
from service.config import ServiceConfig
from service.http.retry_after import MAX_RETRY_AFTER, RecentDurations, queue_retry_after
from service.state import AppState
from tests.service.fake_engine import FakeEngine

USER = [{"role": "user", "content": "hi"}]
ROUTES = [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 2, "n": 2}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 16}),
    ("/v1/messages", {"model": "fake-model", "messages": USER, "max_tokens": 2}),
]


def _durations(*seconds: float) -> RecentDurations:
    durations = RecentDurations()
    for s in seconds:
        durations.add(s)
    return durations


def test_the_wait_is_the_queue_ahead_and_one_more_at_the_rows_pace() -> None:
    # 64 waiting and 16 rows, each request ~10 s: the 65th starts after ~41 s.
    assert queue_retry_after(64, 16, _durations(10, 10, 10)) == 41
    assert queue_retry_after(0, 4, _durations(10)) == 3  # --max-queued 0: one of the 4 rows frees in ~2.5 s
    assert queue_retry_after(4, 2, _durations(1, 2, 3, 300)) == 7  # the median: one very long request does not count


def test_the_wait_is_bounded() -> None:
    assert queue_retry_after(64, 16, RecentDurations()) == 1  # nothing finished yet: no estimate
    assert queue_retry_after(64, 1, _durations(120)) == MAX_RETRY_AFTER == 60  # the SDKs ignore more than 60 s
    assert queue_retry_after(0, 16, _durations(0.01)) == 1  # whole seconds, never 0


def test_only_the_last_durations_count() -> None:
    durations = _durations(*[100.0] * 32, *[2.0] * 32)
    assert durations.typical() == 2.0


def _full(_: Any) -> Any:
    raise QueueFull("4 requests are already waiting for a row (limit 4); retry later", queued=4, limit=4)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path,body", ROUTES)
def test_every_route_answers_queue_full_with_the_estimate(path: str, body: dict[str, Any], stream: bool) -> None:
    engine = FakeEngine()
    engine.submit = _full  # type: ignore[method-assign]
    state = AppState(engine=engine, config=ServiceConfig(max_active=2, max_queued=4))
    for seconds in (10.0, 10.0, 12.0):
        state.recent_durations.add(seconds)
    with TestClient(create_app(state)) as client:
        refused = client.post(path, json={**body, "stream": stream})
    assert refused.status_code == 429, refused.text
    assert refused.headers["retry-after"] == "25"  # (4 waiting + 1) × 10 s over 2 rows
    assert "at capacity" in refused.json()["error"]["message"]


def test_a_generation_answered_whole_adds_its_duration_and_a_refusal_does_not() -> None:
    engine = FakeEngine()
    state = AppState(engine=engine)
    with TestClient(create_app(state)) as client:
        assert client.post("/v1/chat/completions", json={"messages": USER}).status_code == 200
        assert client.post("/v1/messages", json={"model": "fake-model", "messages": USER, "max_tokens": 2,
                                                 "stream": True}).status_code == 200
        assert client.get("/v1/models").status_code == 200  # no generation
        engine.submit = _full  # type: ignore[method-assign]
        assert client.post("/v1/chat/completions", json={"messages": USER}).status_code == 429
    assert len(state.recent_durations._seconds) == 2
