"""The guard in front of the app: API keys on every route, browser origins, readiness, body limits and
read timeouts, websocket message size."""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

import anyio
import pytest
from litestar.exceptions import WebSocketDisconnect
from litestar.testing import TestClient

from service.app import create_app, route_handlers
from service.config import API_KEY_ENV, CONFIG_ENV, ServiceConfig
from service.http import auth
from service.http.guard import HEALTH_PATHS, OPEN_PATHS
from service.limits import Limits
from service.state import AppState
from tests.service.fake_engine import FakeEngine

USER = [{"role": "user", "content": "hi"}]
KEYS = ["key-one", "key-two"]


def _client(engine: FakeEngine | None = None, **config: Any) -> TestClient[Any]:
    return TestClient(create_app(AppState(engine=engine or FakeEngine(), config=ServiceConfig(**config))))


@pytest.fixture
def keyed() -> Iterator[TestClient[Any]]:
    with _client(api_keys=KEYS) as client:
        yield client


def _http_routes() -> list[tuple[str, str]]:
    routes = []
    for handler in route_handlers():
        methods = getattr(handler, "http_methods", None)
        if not methods:
            continue
        for path in handler.paths:
            concrete = re.sub(r"\{[^}]+\}", "some-id", path)
            routes += [(method, concrete) for method in sorted(methods)]
    return routes


HTTP_ROUTES = _http_routes()


@pytest.mark.parametrize("method,path", HTTP_ROUTES, ids=[f"{m} {p}" for m, p in HTTP_ROUTES])
def test_every_route_but_health_needs_a_key(keyed: TestClient[Any], method: str, path: str) -> None:
    anonymous = keyed.request(method, path, json={"messages": USER})
    wrong = keyed.request(method, path, json={"messages": USER}, headers={"authorization": "Bearer nope"})
    bearer = keyed.request(method, path, json={"messages": USER}, headers={"authorization": f"Bearer {KEYS[1]}"})
    header = keyed.request(method, path, json={"messages": USER}, headers={"x-api-key": KEYS[0]})
    if path in OPEN_PATHS:  # /health's answer (also at /v1/health, /readyz, vLLM's /ping), /livez: probes send no key
        assert anonymous.status_code == 200
        return
    for refused in (anonymous, wrong):
        assert refused.status_code == 401, (method, path, refused.text)
        if path.startswith("/v1/messages"):  # Anthropic's routes answer in Anthropic's error shape
            assert refused.json() == {"type": "error", "error": {"type": "authentication_error",
                                                                 "message": refused.json()["error"]["message"]}}
        else:
            assert refused.json()["error"]["code"] == "invalid_api_key"
        assert refused.headers["www-authenticate"] == "Bearer"
    assert bearer.status_code != 401 and header.status_code != 401


def test_the_websocket_needs_a_key_too(keyed: TestClient[Any]) -> None:
    with pytest.raises(WebSocketDisconnect):
        with keyed.websocket_connect("/v1/audio/live") as socket:
            socket.receive_json()
    with keyed.websocket_connect("/v1/audio/live", headers={"x-api-key": KEYS[0]}) as socket:
        # Accepted: the route itself answers (this app serves no Whisper model).
        assert socket.receive_json()["code"] == "model_not_found"


def test_keys_are_compared_in_constant_time_against_every_key(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []

    def compare(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return a == b

    monkeypatch.setattr(auth.hmac, "compare_digest", compare)
    ring = auth.KeyRing(KEYS)
    scope = {"headers": [(b"authorization", f"Bearer {KEYS[0]}".encode())]}
    assert ring.match(scope) == auth.KeyRing.key_id(KEYS[0].encode())
    assert len(compared) == len(KEYS)  # no early exit on the first match


def test_several_keys_from_the_environment() -> None:
    config = ServiceConfig.from_env({CONFIG_ENV: json.dumps({"api_keys": ["a"]}), API_KEY_ENV: "b, c,,"})
    assert config.api_keys == ["a", "b", "c"]


def test_websocket_origin_is_checked(fake_engine: FakeEngine) -> None:
    with _client(fake_engine, allowed_origins=["http://ui.example"]) as client:
        with pytest.raises(WebSocketDisconnect):
            with client.websocket_connect("/v1/audio/live", headers={"origin": "http://evil.example"}) as socket:
                socket.receive_json()
        with client.websocket_connect("/v1/audio/live", headers={"origin": "http://ui.example"}) as socket:
            assert socket.receive_json()["type"] == "error"  # accepted; no Whisper model here


def test_an_origin_given_with_its_trailing_slash_is_allowed_for_fetch_too(fake_engine: FakeEngine) -> None:
    # Copied from an address bar: the websocket check took it, CORS compared exactly, so every fetch from the page
    # failed its preflight (400 "Disallowed CORS Origin", text/plain) while its websockets worked.
    with _client(fake_engine, allowed_origins=["http://ui.example:8911/"]) as client:
        origin = {"origin": "http://ui.example:8911"}
        preflight = client.options("/v1/models", headers={**origin, "access-control-request-method": "GET"})
        assert preflight.status_code in (200, 204)
        assert preflight.headers["access-control-allow-origin"] == "http://ui.example:8911"
        assert client.get("/v1/models", headers=origin).headers["access-control-allow-origin"] == origin["origin"]


def test_an_empty_origin_is_no_origin_and_null_may_be_listed(fake_engine: FakeEngine) -> None:
    # Jan blanks its Tauri webview's origin: the empty header read as a foreign page ("Origin  is not allowed").
    # Origin: null (a sandboxed or file:// page, some webviews) could be let in only with "*".
    with _client(fake_engine) as client:
        assert client.get("/v1/models", headers={"origin": ""}).status_code == 200
        assert client.get("/v1/models", headers={"origin": "null"}).status_code == 403
    with _client(fake_engine, allowed_origins=["null"]) as client:
        allowed = client.get("/v1/models", headers={"origin": "null"})
        assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "null"
        assert client.get("/v1/models", headers={"origin": "http://evil.example"}).status_code == 403


# ------------------------------------------------------------------ bodies


def test_a_body_over_the_limit_is_413_before_it_is_read(fake_engine: FakeEngine) -> None:
    with _client(fake_engine, limits=Limits(max_body_bytes=1000)) as client:
        big = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 2000}]})
        assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
        assert fake_engine.tokenizer.template_calls == []
        assert client.post("/v1/chat/completions", json={"messages": USER}).status_code == 200


def _scope(path: str, headers: list[tuple[bytes, bytes]] | None = None) -> dict[str, Any]:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"host", b"localhost"), *(headers or [])],
        "client": ("127.0.0.1", 1), "server": ("test", 80),
    }


async def _call(app: Any, scope: dict[str, Any], messages: list[dict[str, Any]],
                queue: list[dict[str, Any]] | None = None) -> tuple[int, dict[str, Any], dict[bytes, bytes]]:
    """Run one request whose receive() yields `messages` (taken from `queue` when given: what is left unread stays
    there), then waits forever (a stalled client): its status, body and headers."""
    sent: list[dict[str, Any]] = []
    queue = list(messages) if queue is None else queue

    async def receive() -> dict[str, Any]:
        if queue:
            return queue.pop(0)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body), dict(start["headers"])


@pytest.mark.anyio
async def test_a_chunked_body_is_cut_once_it_passes_the_limit() -> None:
    app = create_app(AppState(engine=FakeEngine(), ready=True, config=ServiceConfig(limits=Limits(max_body_bytes=100))))
    chunks = [{"type": "http.request", "body": b"x" * 60, "more_body": i < 4} for i in range(5)]
    status, body, headers = await _call(app, _scope("/v1/chat/completions"), [], queue=chunks)
    assert status == 413 and body["error"]["code"] == "request_too_large"
    # the rest of the body was read and dropped (a lingering close), and the connection still ends
    assert headers[b"connection"] == b"close" and chunks == []


@pytest.mark.anyio
async def test_a_body_refused_by_its_length_is_read_and_dropped_after_the_413(monkeypatch: pytest.MonkeyPatch) -> None:
    # Node's fetch (openai-node, the Portkey gateway) writes the whole body before it reads: closing under its upload
    # gave it EPIPE ("fetch failed"), never the 413. As nginx's lingering close, the rest is read until it ends.
    from service.http import guard

    app = create_app(AppState(engine=FakeEngine(), ready=True, config=ServiceConfig(limits=Limits(max_body_bytes=100))))
    scope = _scope("/v1/chat/completions", [(b"content-length", b"300")])
    chunks = [{"type": "http.request", "body": b"x" * 100, "more_body": i < 2} for i in range(3)]
    status, body, headers = await _call(app, scope, [], queue=chunks)
    assert status == 413 and headers[b"connection"] == b"close" and chunks == []
    # a client that stops sending is not waited for past LINGER_IDLE_S (the test's receive never answers again)
    monkeypatch.setattr(guard, "LINGER_IDLE_S", 0.01)
    half = [{"type": "http.request", "body": b"x" * 100, "more_body": True}]
    with anyio.fail_after(10):
        status, _, _ = await _call(app, scope, [], queue=half)
    assert status == 413 and half == []


@pytest.mark.anyio
async def test_a_stalled_body_is_answered_408() -> None:
    limits = Limits(body_timeout=0.05)  # the only wait here is the one under test
    app = create_app(AppState(engine=FakeEngine(), ready=True, config=ServiceConfig(limits=limits)))
    start = [{"type": "http.request", "body": b'{"messages": ', "more_body": True}]
    status, body, headers = await _call(app, _scope("/v1/chat/completions"), start)
    assert status == 408 and body["error"]["code"] == "body_timeout" and headers[b"connection"] == b"close"


@pytest.mark.anyio
async def test_a_body_that_trickles_in_is_answered_408_once_it_falls_under_the_minimum_rate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A byte now and then never trips the silence timeout (a byte every 29 s once held a request open for good).
    import service.http.guard as guard

    monkeypatch.setattr(guard, "MIN_BODY_RATE", 10**9)  # every byte buys a nanosecond past the timeout
    app = create_app(AppState(engine=FakeEngine(), ready=True,
                              config=ServiceConfig(limits=Limits(body_timeout=0.1))))
    sent: list[dict[str, Any]] = []

    async def trickle() -> dict[str, Any]:
        await anyio.lowlevel.checkpoint()  # one byte per scheduling turn: never silent for the timeout
        return {"type": "http.request", "body": b" ", "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    with anyio.fail_after(30):  # without the rate bound the request never ends
        await app(_scope("/v1/chat/completions"), trickle, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))
    assert start["status"] == 408 and body["error"]["code"] == "body_too_slow"
    assert dict(start["headers"])[b"connection"] == b"close"


@pytest.mark.parametrize("encoding", ["gzip", "br", "deflate, gzip"])
def test_a_compressed_body_is_refused_by_its_encoding_not_read_as_bad_json(fake_engine: FakeEngine,
                                                                           encoding: str) -> None:
    import gzip

    with _client(fake_engine) as client:
        body = gzip.compress(json.dumps({"messages": USER}).encode())
        response = client.post("/v1/chat/completions", content=body,
                               headers={"content-type": "application/json", "content-encoding": encoding})
        assert response.status_code == 415, response.text
        assert response.json()["error"]["code"] == "unsupported_content_encoding"
        plain = client.post("/v1/chat/completions", json={"messages": USER}, headers={"content-encoding": "identity"})
        assert plain.status_code == 200


def test_routes_have_their_own_size_limits() -> None:
    from service.http.guard import body_limit

    limits = Limits(max_body_bytes=1, max_upload_bytes=2, max_pcm_chunk_bytes=3)
    assert body_limit("/v1/chat/completions", limits) == 1
    assert body_limit("/v1/audio/transcriptions", limits) == body_limit("/v1/audio/translations", limits) == 2
    assert body_limit("/v1/audio/sessions/sess_abc/audio", limits) == 3


# ------------------------------------------------------------------ readiness


def test_requests_get_503_with_retry_after_while_the_engine_loads() -> None:
    release: list[anyio.Event] = []
    loaded = FakeEngine()

    async def load(_: ServiceConfig) -> FakeEngine:
        release.append(anyio.Event())  # created on the app's loop
        await release[0].wait()
        return loaded

    state = AppState(load_engine=load, load_in_background=True)
    with TestClient(create_app(state)) as client:
        waiting = client.post("/v1/chat/completions", json={"messages": USER})
        assert waiting.status_code == 503 and waiting.headers["retry-after"]
        assert waiting.json()["error"]["code"] == "loading"
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "loading"
        models = client.get("/v1/models")  # not an empty list: a client probing would think the model absent
        assert models.status_code == 503 and models.json()["error"]["code"] == "loading"
        client.blocking_portal.call(release[0].set)
        client.blocking_portal.call(_until_ready, state)
        assert client.post("/v1/chat/completions", json={"messages": USER}).status_code == 200


def test_ping_and_v1_health_answer_as_health_while_loading_and_once_ready() -> None:
    # vLLM's health check is /ping (GET, and POST for SageMaker): it was a 503 `loading` error, then a 404.
    release: list[anyio.Event] = []

    async def load(_: ServiceConfig) -> FakeEngine:
        release.append(anyio.Event())
        await release[0].wait()
        return FakeEngine()

    def answers(client: TestClient[Any]) -> set[tuple[int, str, str | None]]:
        got = [client.get(path) for path in HEALTH_PATHS] + [client.post("/ping"), client.head("/ping")]
        assert all(a.status_code == got[0].status_code for a in got[-1:]), got  # HEAD's status as GET's
        return {(a.status_code, a.text, a.headers.get("retry-after")) for a in got[:-1]}

    state = AppState(load_engine=load, load_in_background=True)
    with TestClient(create_app(state)) as client:
        assert answers(client) == {(503, '{"status":"loading","model":null}', "5")}
        client.blocking_portal.call(release[0].set)
        client.blocking_portal.call(_until_ready, state)
        assert answers(client) == {(200, '{"status":"ok","model":"fake-model"}', None)}


async def _until_ready(state: AppState) -> None:
    while not state.ready:
        await anyio.sleep(0)  # a checkpoint: lets the background start run until it reports ready


def test_a_respawned_worker_says_restarting() -> None:
    state = AppState(engine=FakeEngine(), restarting=True)
    assert state.phase == "restarting"
    state.ready = True
    assert state.phase == "ready"
    state.draining = True
    assert state.phase == "stopping"


@pytest.mark.anyio
async def test_a_websocket_message_over_the_limit_reaches_the_app_as_a_refusal_and_an_openai_append_fits() -> None:
    from service.http.guard import FRAME_REFUSED, _FrameLimit

    most = Limits().max_ws_frame_bytes
    append = {"type": "websocket.receive", "text": '{"type": "input_audio_buffer.append", "audio": "'
                                                   + "A" * (15 * 2**20 - 64) + '"}'}  # OpenAI's largest
    over = {"type": "websocket.receive", "bytes": b"\0" * (most + 1)}
    messages = iter([append, over, {"type": "websocket.disconnect", "code": 1000}])

    async def receive() -> dict[str, Any]:
        return next(messages)

    frames = _FrameLimit(receive, most)
    assert await frames.receive() is append
    refused = await frames.receive()  # the app is told, and the connection is not closed under it
    assert refused["type"] == "websocket.receive" and not refused["bytes"] and not refused["text"]
    assert refused[FRAME_REFUSED].code == "message_too_large"
    assert (await frames.receive())["type"] == "websocket.disconnect"


# ------------------------------------------------------------------ browsers


def test_a_page_rebinding_its_domain_to_loopback_is_refused(fake_engine: FakeEngine) -> None:
    # DNS rebinding: the attacker's page is "same origin" with a Host of its own domain. A keyless server on
    # loopback (the default) answers only names of this machine, GETs without an Origin included.
    evil = "rebind.attacker.example:8080"
    with _client(fake_engine) as client:
        chat = client.post("/v1/chat/completions", json={"messages": USER},
                           headers={"host": evil, "origin": f"http://{evil}"})
        assert chat.status_code == 403 and chat.json()["error"]["code"] == "host_not_allowed"
        assert client.get("/v1/models", headers={"host": evil}).status_code == 403
        with pytest.raises(WebSocketDisconnect):
            with client.websocket_connect("/v1/audio/live", headers={"host": evil, "origin": f"http://{evil}"}) as s:
                s.receive_json()
        for name in ("localhost:8080", "127.0.0.1:8080", "[::1]:8080"):
            assert client.get("/v1/models", headers={"host": name}).status_code == 200, name
            ok = client.post("/v1/chat/completions", json={"messages": USER},
                             headers={"host": name, "origin": f"http://{name}"})
            assert ok.status_code == 200, name
    with _client(fake_engine, allowed_hosts=["rebind.attacker.example"]) as client:
        assert client.get("/v1/models", headers={"host": evil}).status_code == 200


def test_a_page_reads_the_request_id_and_retry_advice(fake_engine: FakeEngine) -> None:
    # Hidden from scripts, x-should-retry: false went unseen and the openai SDK on a page retried a 504 twice.
    with _client(fake_engine, allowed_origins=["http://ui.example"], api_keys=KEYS) as client:
        for answer in (client.get("/v1/models", headers={"origin": "http://ui.example", "x-api-key": KEYS[0]}),
                       client.get("/v1/models", headers={"origin": "http://ui.example"})):  # the guard's own 401
            exposed = {h.strip() for h in answer.headers["access-control-expose-headers"].split(",")}
            assert {"x-request-id", "x-should-retry", "retry-after"} <= exposed, answer.status_code


def test_a_preflight_is_answered_while_the_engine_loads_so_the_page_can_read_the_503() -> None:
    release: list[anyio.Event] = []

    async def load(_: ServiceConfig) -> FakeEngine:
        release.append(anyio.Event())
        await release[0].wait()
        return FakeEngine()

    state = AppState(load_engine=load, load_in_background=True,
                     config=ServiceConfig(allowed_origins=["http://ui.example"], api_keys=KEYS))
    with TestClient(create_app(state)) as client:
        preflight = client.options("/v1/chat/completions", headers={
            "Origin": "http://ui.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert preflight.status_code == 204 and preflight.headers["access-control-allow-origin"] == "http://ui.example"
        waiting = client.post("/v1/chat/completions", json={"messages": USER},
                              headers={"Origin": "http://ui.example", "authorization": f"Bearer {KEYS[0]}"})
        assert waiting.status_code == 503 and waiting.json()["error"]["code"] == "loading"
        assert waiting.headers["access-control-allow-origin"] == "http://ui.example"
        assert "retry-after" in waiting.headers["access-control-expose-headers"]
        client.blocking_portal.call(release[0].set)


@pytest.mark.anyio
async def test_a_body_cut_short_is_a_400_and_a_request_without_host_too() -> None:
    # A malformed chunk size reaches the app as a disconnect mid-body: it was answered 499, nginx's private code.
    app = create_app(AppState(engine=FakeEngine(), ready=True, config=ServiceConfig()))
    cut = [{"type": "http.request", "body": b'{"messages": ', "more_body": True}, {"type": "http.disconnect"}]
    status, body, headers = await _call(app, _scope("/v1/chat/completions"), cut)
    assert status == 400 and body["error"]["code"] == "incomplete_body" and headers[b"connection"] == b"close"
    # RFC 9112: a server MUST answer 400 to an HTTP/1.1 request without Host (HTTP/1.0 may leave it out).
    bare = {**_scope("/health"), "method": "GET", "headers": []}
    status, body, _ = await _call(app, bare, [{"type": "http.request", "body": b""}])
    assert status == 400 and body["error"]["code"] == "missing_host"
    status, _, _ = await _call(app, {**bare, "http_version": "1.0"}, [{"type": "http.request", "body": b""}])
    assert status == 200
    # granian hands a request without Host (or with an empty one) an empty Host header: still missing.
    status, body, _ = await _call(app, {**bare, "headers": [(b"host", b"")]}, [{"type": "http.request", "body": b""}])
    assert status == 400 and body["error"]["code"] == "missing_host"


@pytest.mark.anyio
async def test_a_second_host_header_is_a_400() -> None:
    # Only the first Host was checked against the allowed names, so "localhost" then "evil.example" was served.
    app = create_app(AppState(engine=FakeEngine(), ready=True, config=ServiceConfig()))
    twice = {**_scope("/health"), "method": "GET", "headers": [(b"host", b"localhost"), (b"host", b"evil.example")]}
    status, body, _ = await _call(app, twice, [{"type": "http.request", "body": b""}])
    assert status == 400 and body["error"]["code"] == "duplicate_host" and "2" in body["error"]["message"]
    once = {**twice, "headers": [(b"host", b"localhost")]}
    status, _, _ = await _call(app, once, [{"type": "http.request", "body": b""}])
    assert status == 200


@pytest.mark.anyio
async def test_a_refused_websocket_is_answered_in_the_error_shape_where_the_server_can() -> None:
    # A websocket upgrade on /v1/chat/completions got a bare 403, as if the key were wrong.
    app = create_app(AppState(engine=FakeEngine(), ready=True, config=ServiceConfig(api_keys=["k1"])))

    async def refuse(path: str, headers: list[tuple[bytes, bytes]], extensions: dict[str, Any]) -> list[Any]:
        scope = {"type": "websocket", "asgi": {"version": "3.0"}, "http_version": "1.1", "scheme": "ws",
                 "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
                 "headers": [(b"host", b"localhost"), *headers], "client": ("127.0.0.1", 1),
                 "server": ("test", 80), "subprotocols": [], "extensions": extensions}
        sent: list[Any] = []
        messages = [{"type": "websocket.connect"}]

        async def receive() -> dict[str, Any]:
            return messages.pop(0) if messages else {"type": "websocket.disconnect", "code": 1000}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(scope, receive, send)
        return sent

    key = [(b"authorization", b"Bearer k1")]
    answer = await refuse("/v1/chat/completions", key, {"websocket.http.response": {}})
    assert answer[0]["type"] == "websocket.http.response.start" and answer[0]["status"] == 404
    assert json.loads(answer[1]["body"])["error"]["code"] == "not_found"
    answer = await refuse("/v1/realtime", [], {"websocket.http.response": {}})
    assert answer[0]["status"] == 401 and json.loads(answer[1]["body"])["error"]["code"] == "invalid_api_key"
    answer = await refuse("/nope", key, {})  # a server without the extension: a close (HTTP 403 to the client)
    assert answer == [{"type": "websocket.close", "code": 1008, "reason": answer[0]["reason"]}]


def test_a_preflight_for_a_method_the_api_has_not_is_refused_in_openais_shape(fake_engine: FakeEngine) -> None:
    # Litestar's CORS answered it with a text/plain 400 "Disallowed CORS method".
    with _client(fake_engine, allowed_origins=["http://ui.example"]) as client:
        for method in ("PUT", "PATCH", "get"):
            refused = client.options("/v1/chat/completions", headers={"origin": "http://ui.example",
                                                                      "access-control-request-method": method})
            assert refused.status_code == 400 and refused.headers["content-type"].startswith("application/json")
            error = refused.json()["error"]
            assert error["code"] == "cors_method_not_allowed" and error["param"] is None, error
            assert error["type"] == "invalid_request_error" and repr(method) in error["message"], error
            assert "GET, HEAD, POST, DELETE, OPTIONS" in error["message"]
            assert refused.headers["access-control-allow-origin"] == "http://ui.example"  # the page can read it
        for method in ("GET", "HEAD", "POST", "DELETE"):  # HEAD: GET routes answer it (it was refused)
            allowed = client.options("/v1/chat/completions", headers={"origin": "http://ui.example",
                                                                      "access-control-request-method": method})
            assert allowed.status_code == 204, (method, allowed.text)
