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


def test_models_carry_vllms_model_card_fields(fake_engine: FakeEngine) -> None:
    # `vllm bench serve` without --model reads data[0]["root"] (its tokenizer) and failed with KeyError 'root'.
    state = AppState(engine=fake_engine)
    state.extra_models["whisper-tiny"] = ModelCard(id="whisper-tiny", kind="transcription")
    with TestClient(create_app(state)) as client:
        chat, whisper = client.get("/v1/models").json()["data"]
        assert client.get("/v1/models/fake-model").json() == chat
    assert (chat["root"], chat["parent"], chat["max_model_len"]) == ("/models/fake-model", None, 256)
    assert (chat["id"], chat["object"], chat["owned_by"]) == ("fake-model", "model", "mlx-tandem")  # OpenAI's too
    assert (whisper["root"], whisper["parent"], whisper["max_model_len"]) == ("whisper-tiny", None, None)


def test_models_advertise_the_context_the_memory_budget_holds_for_a_request(fake_engine: FakeEngine) -> None:
    # --memory-budget 900M: a 7,031-token prompt got "at most 1278 prompt tokens fit" while this said 8,192, and
    # aider users copy context_length (README).
    fake_engine.context_length, fake_engine.budget_fits = 8192, 1279
    with TestClient(create_app(AppState(engine=fake_engine))) as client:
        chat = client.get("/v1/models").json()["data"][0]
    assert (chat["context_length"], chat["max_model_len"]) == (1279, 1279)


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


def test_health_while_the_engine_process_restarts_says_when_to_come_back(fake_engine: FakeEngine,
                                                                          monkeypatch: Any) -> None:
    # --isolate: 503 restarting came without Retry-After (loading and stopping had one).
    from service.isolate.remote import RESTART_RETRY_AFTER, RemoteEngine
    from service.config import ServiceConfig

    remote = RemoteEngine(ServiceConfig())
    remote._state = "restarting"  # a new engine process is loading the model
    monkeypatch.setattr(fake_engine, "health", remote.health)
    with TestClient(create_app(AppState(engine=fake_engine))) as client:
        response = client.get("/health")
    assert response.status_code == 503 and response.json()["status"] == "restarting"
    assert response.headers["retry-after"] == str(RESTART_RETRY_AFTER)


def test_health_of_a_failing_engine_names_no_time_to_come_back(fake_engine: FakeEngine) -> None:
    fake_engine.failing = "every step fails"
    with TestClient(create_app(AppState(engine=fake_engine))) as client:
        response = client.get("/health")
    assert response.status_code == 503 and response.json()["status"] == "failing"
    assert "retry-after" not in response.headers


def test_stats_includes_engine_stats(client: Any) -> None:
    body = client.get("/stats").json()
    assert body["active_rows"] == 0 and body["queued_rows"] == 0
    assert body["plan"] == {"reasons": ["fake"]}
    assert body["model"] == "fake-model" and body["ready"] is True


def test_stats_shows_the_kept_responses(client: Any) -> None:
    assert client.get("/stats").json()["responses_store"]["entries"] == 0
    assert client.post("/v1/responses", json={"input": "hi"}).status_code == 200
    kept = client.get("/stats").json()["responses_store"]
    assert kept["entries"] >= 1 and 0 < kept["bytes"] <= kept["max_bytes"]


def test_stats_shows_every_limit(fake_engine: FakeEngine) -> None:
    from service.config import ServiceConfig
    from service.limits import Limits

    config = ServiceConfig(max_active=3, api_keys=["secret"], limits=Limits(max_body_bytes=1234))
    with TestClient(create_app(AppState(engine=fake_engine, config=config))) as client:
        limits = client.get("/stats", headers={"x-api-key": "secret"}).json()["limits"]
    assert limits["max_queued"] == 12 and limits["max_body_bytes"] == 1234 and limits["api_keys"] == 1
    assert {"max_upload_bytes", "max_part_bytes", "max_pcm_chunk_bytes", "max_ws_frame_bytes", "header_timeout",
            "body_timeout", "max_json_depth", "render_timeout", "max_tokens_cap", "request_timeout"} <= set(limits)
    assert "secret" not in str(limits)


def test_retrieve_a_model_by_id(client: Any) -> None:
    assert client.get("/v1/models/fake-model").json()["id"] == "fake-model"
    missing = client.get("/v1/models/org/other")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_cors_only_for_the_allowed_origins(fake_engine: FakeEngine) -> None:
    from service.config import ServiceConfig

    config = ServiceConfig(allowed_origins=["http://ui.example"])
    with TestClient(create_app(AppState(engine=fake_engine, config=config))) as client:
        preflight = client.options("/v1/chat/completions", headers={
            "Origin": "http://ui.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == "http://ui.example"
        answer = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                             headers={"Origin": "http://ui.example"})
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "http://ui.example"
        other = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                            headers={"Origin": "http://evil.example"})
        assert other.status_code == 403 and other.json()["error"]["code"] == "origin_not_allowed"


def test_a_browser_sdk_passes_the_preflight_and_reads_the_guards_errors(fake_engine: FakeEngine) -> None:
    from service.config import ServiceConfig

    config = ServiceConfig(allowed_origins=["http://ui.example"], api_keys=["k1"])
    with TestClient(create_app(AppState(engine=fake_engine, config=config))) as client:
        # What the openai JS SDK and pi send beside the key.
        asked = "authorization,content-type,x-stainless-lang,x-stainless-retry-count,session_id"
        preflight = client.options("/v1/chat/completions", headers={
            "Origin": "http://ui.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": asked})
        assert preflight.status_code == 204, preflight.text
        allowed = {h.strip().lower() for h in preflight.headers["access-control-allow-headers"].split(",")}
        assert set(asked.split(",")) <= allowed
        unkeyed = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                              headers={"Origin": "http://ui.example"})
        assert unkeyed.status_code == 401 and unkeyed.headers["access-control-allow-origin"] == "http://ui.example"
        other = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                            headers={"Origin": "http://evil.example", "authorization": "Bearer k1"})
        assert other.status_code == 403 and "access-control-allow-origin" not in other.headers


def test_no_cors_by_default_and_cross_origin_requests_are_refused(client: Any) -> None:
    # A text/plain POST needs no preflight: without an origin check any web page could drive the server.
    answer = client.post("/v1/chat/completions", content=b'{"messages": [{"role": "user", "content": "x"}]}',
                         headers={"Origin": "http://evil.example", "content-type": "text/plain"})
    assert answer.status_code == 403 and "access-control-allow-origin" not in answer.headers
    same_origin = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                              headers={"Origin": "http://testserver.local"})
    assert same_origin.status_code == 200
