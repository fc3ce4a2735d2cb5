"""GET /v1/models, /health, /stats and /metrics."""

from __future__ import annotations

from typing import Any

from litestar.testing import TestClient

from service.app import create_app
from service.state import AppState
from service.admin.schemas import ModelCard
from tests.service.fake_engine import FakeEngine


def test_models_lists_the_chat_model_then_others(fake_engine: FakeEngine) -> None:
    state = AppState(engine=fake_engine)
    state.extra_models["whisper-tiny"] = ModelCard(id="whisper-tiny", kind="transcription")
    with TestClient(create_app(state)) as client:
        body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["fake-model", "whisper-tiny"]
    assert body["data"][0]["object"] == "model" and body["data"][0]["context_length"] == 256


def test_served_model_name_and_aliases(fake_engine: FakeEngine) -> None:
    from service.config import ServiceConfig

    state = AppState(engine=fake_engine, config=ServiceConfig(model="/models/fake", served_model_name="mine"))
    with TestClient(create_app(state)) as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["mine"]
        for name in ("mine", "/models/fake"):
            assert client.post("/v1/completions", json={"model": name, "prompt": "a"}).status_code == 200
        assert client.post("/v1/completions", json={"model": "fake-model", "prompt": "a"}).status_code == 404


def test_health_is_ready_inside_the_lifespan_and_engine_serves(fake_engine: FakeEngine) -> None:
    state = AppState(engine=fake_engine)
    with TestClient(create_app(state)) as client:
        response = client.get("/health")
        assert response.status_code == 200 and response.json() == {"status": "ok", "model": "fake-model"}
        assert fake_engine.serving
    assert not state.ready and not fake_engine.serving  # shutdown closed the engine and its loop returned


def test_stats_includes_engine_stats(client: Any) -> None:
    body = client.get("/stats").json()
    assert body["active_rows"] == 0 and body["queued_rows"] == 0
    assert body["plan"] == {"reasons": ["fake"]}
    assert body["model"] == "fake-model" and body["ready"] is True


def test_metrics_are_prometheus_gauges(client: Any) -> None:
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    lines = response.text.splitlines()
    assert "tandem_active_rows 0" in lines and "# TYPE tandem_active_rows gauge" in lines


def test_retrieve_a_model_by_id(client: Any) -> None:
    assert client.get("/v1/models/fake-model").json()["id"] == "fake-model"
    missing = client.get("/v1/models/org/other")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_cors_for_browser_clients(client: Any) -> None:
    preflight = client.options("/v1/chat/completions", headers={
        "Origin": "http://ui.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert preflight.status_code == 204 and preflight.headers["access-control-allow-origin"] == "*"
    answer = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                         headers={"Origin": "http://ui.example"})
    assert answer.headers["access-control-allow-origin"] == "*"
