"""One access-log line per request: method, path, status, duration, and tokens where the route knows them."""

from __future__ import annotations

import re
from typing import Any

import pytest

from service.logs import configure_logging


@pytest.fixture(autouse=True)
def _logs_at_info() -> None:
    configure_logging("info")


# Each line ends with the request's id (its x-request-id) and the client's address.
_END = r" req_[0-9a-f]{32} from \S+"


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if re.match(r"tandem: (GET|POST|DELETE|OPTIONS) ", line)]


def test_a_chat_completion_logs_its_tokens(client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    body = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    (line,) = _lines(capsys.readouterr().err)
    usage = body["usage"]
    assert re.fullmatch(rf"tandem: POST /v1/chat/completions 200 \d+\.\d ms tokens {usage['prompt_tokens']}"
                        rf"\+{usage['completion_tokens']}{_END}", line), line


def test_a_stream_is_logged_once_it_ends(client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    with client.stream("POST", "/v1/completions", json={"prompt": "ab", "stream": True}) as response:
        assert response.status_code == 200
        "".join(response.iter_text())
    (line,) = _lines(capsys.readouterr().err)
    assert line.startswith("tandem: POST /v1/completions 200 ") and re.search(r" tokens 2\+5" + _END + "$", line), line


def test_unrouted_and_failed_requests_are_logged(client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    client.get("/nowhere?x=1")
    client.post("/v1/chat/completions", json={"messages": []})
    lines = _lines(capsys.readouterr().err)
    assert [line.split(" ms")[0].rsplit(" ", 1)[0] for line in lines] == [
        "tandem: GET /nowhere?x=1 404", "tandem: POST /v1/chat/completions 400"]


def test_a_path_cannot_forge_a_line_of_its_own(client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    client.get("/v1/x%0Atandem:%20POST%20/v1/fake%20200?q=%0A")
    err = capsys.readouterr().err
    assert "tandem: POST /v1/fake" not in err
    (line,) = _lines(err)
    assert line.startswith("tandem: GET /v1/x%0Atandem:%20POST%20/v1/fake%20200?q=%0A 404 "), line


def test_a_head_request_is_logged_as_head(client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    client.head("/health")
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tandem: HEAD")]
    assert line.startswith("tandem: HEAD /health 200 "), line


def test_a_websocket_is_logged_when_it_ends(client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from litestar.exceptions import WebSocketDisconnect

    capsys.readouterr()
    with client.websocket_connect("/v1/realtime?intent=transcription") as ws:  # no Whisper model here
        assert ws.receive_json()["type"] == "error"
        with pytest.raises(WebSocketDisconnect):
            ws.receive_json()
    with pytest.raises(WebSocketDisconnect), \
            client.websocket_connect("/v1/audio/live", headers={"origin": "http://elsewhere.example"}):
        pass
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tandem: WS ")]
    assert len(lines) == 2, lines
    assert re.fullmatch(r"tandem: WS /v1/realtime\?intent=transcription 101 \d+\.\d ms closed 10\d\d" + _END, lines[0])
    # why, in the log: the client sees a bare 403
    assert re.fullmatch(r'tandem: WS /v1/audio/live 403 \d+\.\d ms refused: "Origin http://elsewhere.example is not '
                        r'allowed[^"]*"' + _END, lines[1]), lines[1]


def test_a_websocket_refused_for_its_key_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    from litestar.exceptions import WebSocketDisconnect
    from litestar.testing import TestClient

    from service.app import create_app
    from service.config import ServiceConfig
    from service.state import AppState
    from tests.service.fake_engine import FakeEngine

    with TestClient(create_app(AppState(engine=FakeEngine(), config=ServiceConfig(api_keys=["k"])))) as client:
        capsys.readouterr()
        with pytest.raises(WebSocketDisconnect), client.websocket_connect(
                "/v1/realtime?intent=transcription",
                headers={"sec-websocket-protocol": "realtime, openai-insecure-api-key.wrong"}):
            pass
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tandem: WS ")]
    assert re.fullmatch(r'tandem: WS /v1/realtime\?intent=transcription 403 \d+\.\d ms refused: "Missing or '
                        r'incorrect API key[^"]*"' + _END, line), line


@pytest.mark.anyio
async def test_a_stream_the_client_left_is_logged_as_incomplete(capsys: pytest.CaptureFixture[str]) -> None:
    # The status line went out as 200; the client then left mid-stream. The line says so, where it read like a whole
    # answer before.
    from service.http.access_log import AccessLog

    async def streaming(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        if (await receive())["type"] == "http.disconnect":
            return  # as a streaming response stops once the client is gone
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def whole(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})

    async def gone() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def sink(message: Any) -> None:
        pass

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "query_string": b""}
    capsys.readouterr()
    await AccessLog(streaming)(dict(scope), gone, sink)
    await AccessLog(whole)(dict(scope), gone, sink)
    left, answered = _lines(capsys.readouterr().err)
    assert re.fullmatch(r"tandem: POST /v1/chat/completions 200 \d+\.\d ms incomplete: the client left" + _END, left), left
    assert re.fullmatch(r"tandem: POST /v1/chat/completions 200 \d+\.\d ms" + _END, answered), answered


@pytest.mark.anyio
async def test_a_websocket_session_is_counted_once_as_it_ends() -> None:
    # /metrics left websocket sessions out: Realtime and /v1/audio/live never appeared in tandem_requests_total.
    from service.http.access_log import AccessLog

    class Metrics:
        def __init__(self) -> None:
            self.requests: list[tuple[str, str, int | None]] = []
            self.sessions: list[tuple[str, int | None]] = []

        def observe_request(self, route: str, method: str, status: int | None, seconds: float) -> None:
            self.requests.append((route, method, status))

        def observe_session(self, route: str, status: int | None, seconds: float) -> None:
            self.sessions.append((route, status))

    async def session(scope: Any, receive: Any, send: Any) -> None:
        scope["path_template"] = "/v1/realtime"  # as the router sets it
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": 1000})

    async def refused(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "websocket.close", "code": 1008})

    async def nothing() -> dict[str, Any]:
        return {"type": "websocket.disconnect"}

    async def sink(message: Any) -> None:
        pass

    metrics = Metrics()
    scope = {"type": "websocket", "path": "/v1/realtime", "query_string": b"intent=transcription"}
    await AccessLog(session, metrics)(dict(scope), nothing, sink)
    await AccessLog(refused, metrics)(dict(scope, path="/v1/audio/live"), nothing, sink)
    assert metrics.sessions == [("/v1/realtime", 101), ("unrouted", 403)]
    assert metrics.requests == []  # a session's length is not a response time


def test_every_response_carries_its_own_request_id(client: Any) -> None:
    # The openai SDKs read x-request-id into `_request_id`: routed, streamed, unrouted, invalid and guard-refused
    # answers all carry one, fresh per request.
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    answers = [client.post("/v1/chat/completions", json=chat), client.get("/nowhere"), client.head("/health"),
               client.post("/v1/chat/completions", json={"messages": []}),
               client.post("/v1/chat/completions", content=b"x", headers={"content-encoding": "gzip"})]
    with client.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as streamed:
        "".join(streamed.iter_text())
    answers.append(streamed)
    assert [r.status_code for r in answers] == [200, 404, 200, 400, 415, 200]
    ids = [r.headers["x-request-id"] for r in answers]
    assert all(re.fullmatch(r"req_[0-9a-f]{32}", i) for i in ids) and len(set(ids)) == len(ids), ids


def test_a_line_names_the_request_id_the_client_got(client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # A user's report quotes the SDK's `_request_id`; without it in the log, no line could be matched to it.
    capsys.readouterr()
    answer = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    (line,) = _lines(capsys.readouterr().err)
    assert line.endswith(f" {answer.headers['x-request-id']} from testclient"), line


def test_a_clients_sane_request_id_is_kept(client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM echoes X-Request-Id and `vllm bench serve` sends one a request: its ids find its requests in the log.
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    capsys.readouterr()
    own = "bench-7f3a:0001/x_" + "z" * 110  # 128 visible ASCII characters
    kept = client.post("/v1/chat/completions", json=chat, headers={"X-Request-Id": own})
    assert kept.headers["x-request-id"] == own
    (line,) = _lines(capsys.readouterr().err)
    assert line.endswith(f" {own} from testclient"), line
    # A space (a second word in the log line), a control character, a non-ASCII byte, 129 characters, nothing.
    for bad in (b"two words", b"tab\there", b"caf\xe9", b"a" * 129, b""):
        answer = client.post("/v1/chat/completions", json=chat, headers={"X-Request-Id": bad})
        assert re.fullmatch(r"req_[0-9a-f]{32}", answer.headers["x-request-id"]), bad


def test_a_refusal_says_why(client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # "POST /v1/chat/completions 400 1.7 ms" told the operator nothing; the error's code and field do.
    capsys.readouterr()
    bad = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "n": 99})
    client.get("/nowhere")
    refused, missing = _lines(capsys.readouterr().err)
    error = bad.json()["error"]
    assert bad.status_code == 400 and error["param"] == "n"
    assert f" ms error {error['code'] or error['type']} (n) req_" in refused, refused
    assert re.search(r" 404 \d+\.\d ms error \S+ req_", missing), missing


def test_a_stream_that_failed_after_its_200_says_why(client: Any, fake_engine: Any,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # The client got an error event and [DONE]; the line read like a whole answer.
    fake_engine.fail_with = "the device is gone"
    capsys.readouterr()
    with client.stream("POST", "/v1/chat/completions",
                       json={"messages": [{"role": "user", "content": "hi"}], "stream": True}) as response:
        assert response.status_code == 200
        text = "".join(response.iter_text())
    assert '"error"' in text
    (line,) = _lines(capsys.readouterr().err)
    assert re.search(r"POST /v1/chat/completions 200 \d+\.\d ms .*error \S+ req_", line), line



@pytest.mark.anyio
async def test_behind_a_trusted_proxy_the_line_names_the_forwarded_client(capsys: pytest.CaptureFixture[str]) -> None:
    # Behind nginx every line said "from 127.0.0.1": the proxy, never the client.
    from service.http.access_log import AccessLog

    async def whole(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})

    async def sink(message: Any) -> None:
        pass

    scope = {"type": "http", "method": "GET", "path": "/health", "query_string": b"",
             "headers": [(b"x-forwarded-for", b"198.51.100.1, 203.0.113.7")]}
    capsys.readouterr()
    await AccessLog(whole)(dict(scope, client=("127.0.0.1", 50000)), sink, sink)  # the default trusts 127.0.0.1
    await AccessLog(whole)(dict(scope, client=("192.0.2.9", 50000)), sink, sink)  # any other peer is not believed
    proxied, direct = _lines(capsys.readouterr().err)
    assert proxied.endswith(" from 203.0.113.7 via 127.0.0.1"), proxied
    assert direct.endswith(" from 192.0.2.9"), direct


@pytest.mark.anyio
async def test_a_websocket_line_names_its_request_id_and_client(capsys: pytest.CaptureFixture[str]) -> None:
    # `WS /v1/realtime?intent=transcription 101 8.5 ms closed by the client` named neither: no report could find it.
    from service.http.access_log import AccessLog

    async def session(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": 1000})

    async def nothing() -> Any:
        return {"type": "websocket.disconnect", "code": 1000}

    async def sink(message: Any) -> None:
        pass

    scope = {"type": "websocket", "path": "/v1/realtime", "query_string": b"intent=transcription",
             "headers": [(b"x-forwarded-for", b"198.51.100.1, 203.0.113.7"), (b"x-request-id", b"call-42")]}
    capsys.readouterr()
    await AccessLog(session)(dict(scope, client=("127.0.0.1", 50000)), nothing, sink)  # 127.0.0.1: a trusted proxy
    await AccessLog(session)(dict(scope, client=("192.0.2.9", 50000), headers=[]), nothing, sink)
    proxied, direct = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tandem: WS ")]
    assert re.fullmatch(r"tandem: WS /v1/realtime\?intent=transcription 101 \d+\.\d ms closed 1000 call-42 "
                        r"from 203\.0\.113\.7 via 127\.0\.0\.1", proxied), proxied
    assert re.fullmatch(r"tandem: WS /v1/realtime\?intent=transcription 101 \d+\.\d ms closed 1000 req_[0-9a-f]{32} "
                        r"from 192\.0\.2\.9", direct), direct


def test_forwarded_allow_ips_reaches_the_log(capsys: pytest.CaptureFixture[str]) -> None:
    from litestar.testing import TestClient

    from service.app import create_app
    from service.config import ServiceConfig
    from service.state import AppState
    from tests.service.fake_engine import FakeEngine

    for trusted, end in ((["*"], " from 198.51.100.1 via testclient"), (["127.0.0.1"], " from testclient")):
        config = ServiceConfig(forwarded_allow_ips=trusted)
        with TestClient(create_app(AppState(engine=FakeEngine(), config=config))) as client:
            capsys.readouterr()
            client.get("/v1/models", headers={"x-forwarded-for": "198.51.100.1, 203.0.113.7"})
            (line,) = _lines(capsys.readouterr().err)
        assert line.endswith(end), line


def test_a_long_end_user_id_is_cut_on_the_line(client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # `user` and `safety_identifier` went on the line whole: a 100 kB id made a 100 kB log line. The API still takes it.
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    capsys.readouterr()
    assert client.post("/v1/chat/completions", json={**chat, "user": "u" * 64}).status_code == 200
    assert client.post("/v1/chat/completions", json={**chat, "user": "a" * 64 + "z" * 100_000}).status_code == 200
    assert client.post("/v1/completions", json={"prompt": "x", "safety_identifier": "s" * 65}).status_code == 200
    whole, cut, identifier = _lines(capsys.readouterr().err)
    assert f' user "{"u" * 64}" req_' in whole, whole
    assert f' user "{"a" * 64}"... req_' in cut and "z" not in cut, cut
    assert f' user "{"s" * 64}"... req_' in identifier, identifier
    assert len(cut) < 300


def test_metadata_is_bounded_on_the_line(client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # 16 keys of 64 emoji and values of 512 (within OpenAI's limits) went on the line whole, escaped: 110 kB a request.
    emoji = {"\U0001f600" * 63 + f"{i:x}": "\U0001f600" * 512 for i in range(16)}
    plain = {"k" * 64: "v" * 512, "q": 'a"' * 40, "short": "tag"}
    capsys.readouterr()
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/completions", {"prompt": "x"})):
        for metadata in (emoji, plain):
            assert client.post(path, json={**body, "metadata": metadata}).status_code == 200
    lines = _lines(capsys.readouterr().err)
    assert len(lines) == 4, lines
    for line in lines[0::2]:  # each key and value cut to 64 written characters (5 emoji), pairs past 1,024 left out
        written = line.split(" metadata ", 1)[1].rsplit(" req_", 1)[0]
        assert len(written) <= 1024 and len(line) < 1400, len(line)
        pair = '"' + r"\ud83d\ude00" * 5 + '"...:"' + r"\ud83d\ude00" * 5 + '"...'
        assert written.startswith("{" + pair + ",") and written.endswith(",...}"), written
    for line in lines[1::2]:  # a key of 64 ASCII is whole; an escape is never split
        assert (f' metadata {{"{"k" * 64}":"{"v" * 64}"...,"q":"{chr(92).join(["a"] + [chr(34) + "a"] * 21)}"...,'
                f'"short":"tag"}} req_') in line, line


def test_json_lines_carry_the_lines_parts_as_keys(client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # --log-format json: a log collector filters on status and path instead of parsing the message.
    import json

    configure_logging("info", "json")
    try:
        capsys.readouterr()
        answer = client.post("/v1/chat/completions?x=1", json={"messages": [{"role": "user", "content": "hi"}],
                                                               "user": "alice"})
        client.post("/v1/chat/completions", json={"messages": []})
        ok, refused = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    finally:
        configure_logging("info")
    usage = answer.json()["usage"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", ok["time"]), ok
    assert (ok["level"], ok["logger"]) == ("INFO", "tandem.access")
    assert ok["message"].startswith("POST /v1/chat/completions?x=1 200 "), ok
    assert {key: ok[key] for key in ("method", "path", "query", "status", "request_id", "user", "prompt_tokens",
                                     "completion_tokens")} == {
        "method": "POST", "path": "/v1/chat/completions", "query": "x=1", "status": 200,
        "request_id": answer.headers["x-request-id"], "user": "alice", "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"]}
    assert isinstance(ok["duration_ms"], float) and ok["client"]
    assert (refused["status"], refused["error"]) == (400, refused["message"].split(" error ")[1].split(" req_")[0])


def test_a_failed_streams_metrics_label_is_its_code_or_other() -> None:
    # tandem_stream_failures_total{code}: the server's codes (a fixed set) or the error's type where it has none
    # (Anthropic's); anything else one label, so no series is made from unexpected text.
    from service.http.access_log import _code_label

    assert _code_label({"code": "request_timeout", "type": "server_error"}) == "request_timeout"
    assert _code_label({"code": None, "type": "server_error"}) == "server_error"
    assert _code_label({"type": "timeout_error"}) == "timeout_error"
    assert _code_label({"code": "Not A Code"}) == _code_label({"code": "x" * 41}) == _code_label({}) == "other"
