"""/metrics through prometheus-client: counters are counters, values keep their precision, requests are
counted by route template (never by raw path), engine and memory figures are gauges."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.app import create_app
from service.state import AppState
from tests.service.fake_engine import FakeEngine


def _families(client: TestClient[Any]) -> dict[str, Any]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"  # the charset once
    return {family.name: family for family in text_string_to_metric_families(response.text)}


def _value(family: Any, **labels: str) -> float:
    return next(s.value for s in family.samples if all(s.labels.get(k) == v for k, v in labels.items())
                and not s.name.endswith("_created"))


def test_engine_totals_are_counters_and_keep_their_precision() -> None:
    engine = FakeEngine()
    totals = {"prompt_tokens": 123_456_789_012, "generation_tokens": 987_654_321, "finished_rows": 7}
    engine.stats = lambda: {"active_rows": 3, "queued_rows": 2, "kv_bytes": 4_294_967_297, **totals,  # type: ignore[method-assign]
                            "prefix_cache": {"hit_tokens": 555, "bytes": 1024, "hits": 1, "misses": 2,
                                             "promotions": 4, "probation_bytes": 512},
                            "memory": {"budget": {"total": 8_589_934_592, "kv": 1_000_000, "kv_token_bytes": 36_864,
                                                  "kv_state_bytes": 2048, "kv_row_bytes": 4096},
                                       "slot_bytes": 4096,
                                       "process_rss_bytes": 123_456_789}}
    with TestClient(create_app(AppState(engine=engine))) as client:
        families = _families(client)
    assert families["tandem_engine_prompt_tokens"].type == "counter"
    assert _value(families["tandem_engine_prompt_tokens"]) == 123_456_789_012  # `:g` printed 1.23457e+11
    assert families["tandem_prefix_cache_hit_tokens"].type == "counter"
    assert _value(families["tandem_prefix_cache_hit_tokens"]) == 555
    assert _value(families["tandem_prefix_cache_promotions"]) == 4
    assert _value(families["tandem_prefix_cache_probation_bytes"]) == 512
    assert families["tandem_active_rows"].type == "gauge" and _value(families["tandem_active_rows"]) == 3
    assert _value(families["tandem_kv_bytes"]) == 4_294_967_297
    assert _value(families["tandem_memory_budget_bytes"], part="total") == 8_589_934_592
    # The per-token and per-row shares are gauges of their own: every sample of the budget family is a part of it.
    assert {s.labels.get("part") for s in families["tandem_memory_budget_bytes"].samples} == {"total", "kv"}
    assert _value(families["tandem_kv_bytes_per_token"]) == 36_864
    assert _value(families["tandem_kv_bytes_per_row"]) == 4096
    assert _value(families["tandem_memory_bytes"], part="process_rss") == 123_456_789


def test_isolate_restarts_are_a_counter() -> None:
    # --isolate: the engine's counters start again from 0 after a restart; only /stats said how many there were.
    engine = FakeEngine()
    engine.stats = lambda: {"active_rows": 0, "isolate": {"state": "ready", "pid": 1, "restarts": 2}}  # type: ignore[method-assign]
    with TestClient(create_app(AppState(engine=engine))) as client:
        families = _families(client)
    assert families["tandem_engine_restarts"].type == "counter"
    assert _value(families["tandem_engine_restarts"]) == 2


def test_requests_are_counted_by_route_template_and_status(client: TestClient[Any]) -> None:
    client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    client.get("/v1/models/fake-model")
    client.get("/v1/models/some/other/model")
    client.get("/nothing/here")
    requests = _families(client)["tandem_requests"]
    assert requests.type == "counter"
    assert _value(requests, route="/v1/chat/completions", method="POST", status="200") == 1
    assert _value(requests, route="/v1/models/{model_id}", status="404") == 1
    assert _value(requests, route="unrouted", status="404") == 1
    assert not any("fake-model" in s.labels.get("route", "") for s in requests.samples)
    durations = _families(client)["tandem_request_duration_seconds"]
    assert durations.type == "histogram"


def test_head_requests_and_refusals_before_routing_count_under_their_route(client: TestClient[Any]) -> None:
    # HEAD /health (a load balancer's probe), a foreign Host's 403 and a wrong method were all route="guard".
    client.head("/health")
    client.head("/metrics")
    assert client.get("/v1/models", headers={"host": "evil.example"}).status_code == 403
    assert client.put("/v1/models").status_code == 405
    requests = _families(client)["tandem_requests"]
    assert _value(requests, route="/health", method="HEAD", status="200") == 1
    assert _value(requests, route="/metrics", method="HEAD", status="200") == 1
    assert _value(requests, route="/v1/models", method="GET", status="403") == 1
    assert _value(requests, route="/v1/models", method="PUT", status="405") == 1
    assert not any(s.labels.get("route") == "guard" for s in requests.samples)


def test_invented_methods_share_one_label(client: TestClient[Any]) -> None:
    for method in ("FOO1", "FOO2", "BAR19683"):
        client.request(method, "/v1/models")
    requests = _families(client)["tandem_requests"]
    methods = {s.labels.get("method") for s in requests.samples}
    assert not methods & {"FOO1", "FOO2", "BAR19683"} and "other" in methods


def test_garbage_collections_are_counters_by_generation() -> None:
    import gc

    with TestClient(create_app(AppState(engine=FakeEngine()))) as client:  # startup installs the counting
        gc.collect(2)
        families = _families(client)
        stats = client.get("/stats").json()["gc"]
    assert families["tandem_gc_collections"].type == "counter"
    assert _value(families["tandem_gc_collections"], generation="2") >= 1
    assert _value(families["tandem_gc_pause_seconds"], generation="2") > 0
    assert stats["generations"][2]["collections"] >= 1


def test_websocket_sessions_are_counted_by_route() -> None:
    from litestar.exceptions import WebSocketDisconnect

    with TestClient(create_app(AppState(engine=FakeEngine()))) as client:
        with client.websocket_connect("/v1/realtime?intent=transcription") as ws:  # no Whisper: refused in-band
            assert ws.receive_json()["type"] == "error"
            with pytest.raises(WebSocketDisconnect):
                ws.receive_json()
        requests = _families(client)["tandem_requests"]
    assert _value(requests, route="/v1/realtime", method="WS", status="101") == 1


def _usage_totals(families: dict[str, Any], route: str) -> tuple[float, float, float]:
    return tuple(_value(families[f"tandem_usage_{kind}_tokens"], route=route)  # type: ignore[return-value]
                 for kind in ("prompt", "completion", "cached"))


def test_usage_counters_add_up_to_the_usage_clients_were_sent(fake_engine: FakeEngine,
                                                             client: TestClient[Any]) -> None:
    # Only the engine's prefilled tokens were counted (prefix-cache hits left out, once per row): nothing added up to
    # the usage the requests were answered with.
    from tests.service.conftest import sse_events

    fake_engine.cached_tokens = 2
    user = [{"role": "user", "content": "hi"}]
    chat = [client.post("/v1/chat/completions", json={"messages": user}).json()["usage"],
            client.post("/v1/chat/completions", json={"messages": user, "n": 2}).json()["usage"],
            sse_events(client.post("/v1/chat/completions", json={"messages": user, "stream": True, "stream_options":
                                                                  {"include_usage": True}}).text)[-2]["usage"]]
    text = client.post("/v1/completions", json={"prompt": ["ab", "cde"]}).json()["usage"]
    message = client.post("/v1/messages", json={"model": "fake-model", "max_tokens": 8, "messages": user}).json()
    assert client.post("/v1/chat/completions", json={"messages": user, "max_tokens": -1}).status_code == 400
    families = _families(client)
    for kind in ("prompt", "completion", "cached"):
        assert families[f"tandem_usage_{kind}_tokens"].type == "counter"
    assert _usage_totals(families, "/v1/chat/completions") == (
        sum(u["prompt_tokens"] for u in chat), sum(u["completion_tokens"] for u in chat),
        sum(u["prompt_tokens_details"]["cached_tokens"] for u in chat))
    assert _usage_totals(families, "/v1/completions") == (text["prompt_tokens"], text["completion_tokens"],
                                                           text["prompt_tokens_details"]["cached_tokens"])
    used = message["usage"]
    assert _usage_totals(families, "/v1/messages") == (used["input_tokens"] + used["cache_read_input_tokens"],
                                                        used["output_tokens"], used["cache_read_input_tokens"])


def test_a_stream_failing_after_its_headers_is_counted_by_its_code(fake_engine: FakeEngine) -> None:
    # It counted only in tandem_requests_total, by its headers' 200: nothing told the operator it failed.
    from service.config import ServiceConfig
    from tests.service.conftest import sse_events

    fake_engine.gate = anyio.Event()  # every row stalls after its first token, to the deadline
    user = [{"role": "user", "content": "hi"}]
    config = ServiceConfig(request_timeout=0.2)
    with TestClient(create_app(AppState(engine=fake_engine, config=config))) as client:
        streamed = client.post("/v1/chat/completions", json={"messages": user, "stream": True,
                                                             "stream_options": {"include_usage": True}})
        usage = sse_events(streamed.text)[-3]["usage"]
        client.post("/v1/messages", json={"model": "fake-model", "max_tokens": 8, "messages": user, "stream": True})
        assert client.post("/v1/completions", json={"prompt": "hi"}).status_code == 504  # before its headers
        families = _families(client)
    failures = families["tandem_stream_failures"]
    assert failures.type == "counter"
    assert _value(failures, route="/v1/chat/completions", code="request_timeout") == 1
    assert _value(failures, route="/v1/messages", code="timeout_error") == 1  # Anthropic's error type: it has no code
    assert not any(s.labels.get("route") == "/v1/completions" for s in failures.samples)  # a 504, counted as such
    requests = families["tandem_requests"]
    assert _value(requests, route="/v1/chat/completions", status="200") == 1  # the status label is as it was
    assert _value(requests, route="/v1/completions", status="504") == 1
    # As far as it got, as its usage chunk said; the 504 gave no usage and counts none.
    assert _usage_totals(families, "/v1/chat/completions")[:2] == (usage["prompt_tokens"], usage["completion_tokens"])
    assert not any(s.labels.get("route") == "/v1/completions" for s in families["tandem_usage_prompt_tokens"].samples)
