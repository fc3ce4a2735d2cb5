"""EventSource releases its resource however streaming ends; run_while_connected follows the client; every event's
JSON keeps to one line for str.splitlines()."""

from __future__ import annotations

import json
from typing import Any, AsyncGenerator

import anyio
import pytest

from service.http.disconnect import ClientDisconnected, run_while_connected
from service.http.sse import EventSource, line_safe
from tests.service.fake_engine import FakeEngine


async def _events(log: list[str]) -> AsyncGenerator[bytes, None]:
    try:
        yield b"data: 1\n\n"
        yield b"data: 2\n\n"
    finally:
        log.append("generator closed")


@pytest.mark.anyio
async def test_aclose_releases_even_when_never_started() -> None:
    log: list[str] = []

    async def release() -> None:
        log.append("released")

    source = EventSource(_events(log), release)
    await source.aclose()
    assert log == ["released"]  # an unstarted generator has no finally to run; on_close still does
    await source.aclose()
    assert log == ["released"]  # once


@pytest.mark.anyio
async def test_aclose_mid_stream_closes_generator_then_releases() -> None:
    log: list[str] = []

    async def release() -> None:
        await anyio.lowlevel.checkpoint()  # runs shielded, so it completes inside a cancelled scope too
        log.append("released")

    source = EventSource(_events(log), release)
    assert await source.__anext__() == b"data: 1\n\n"
    with anyio.CancelScope() as scope:
        scope.cancel()
        await source.aclose()
    assert log == ["generator closed", "released"]


class _Request:
    def __init__(self) -> None:
        self.gone = anyio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}


@pytest.mark.anyio
async def test_run_while_connected_returns_the_result() -> None:
    async def work() -> int:
        return 42

    assert await run_while_connected(_Request(), work) == 42  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_run_while_connected_cancels_work_when_the_client_leaves() -> None:
    request = _Request()
    cancelled: list[bool] = []

    async def work() -> int:
        try:
            request.gone.set()
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append(True)
            raise
        return 0

    with pytest.raises(ClientDisconnected):
        await run_while_connected(request, work)  # type: ignore[arg-type]
    assert cancelled == [True]


@pytest.mark.anyio
async def test_run_while_connected_reraises_errors_unwrapped() -> None:
    async def work() -> int:
        raise LookupError("x")

    with pytest.raises(LookupError):
        await run_while_connected(_Request(), work)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_stream_its_client_stopped_reading_is_ended_and_its_row_freed() -> None:
    # granian's send waits while the client's socket is full: a client that stopped reading held its row generating
    # to max_tokens. Past the send timeout the response ends unfinished (granian then drops the connection).
    import json

    from service.app import create_app
    from service.config import ServiceConfig
    from service.limits import Limits
    from service.state import AppState
    from tests.service.fake_engine import FakeEngine

    engine = FakeEngine(pieces=["tok"] * 200)
    app = create_app(AppState(engine=engine, ready=True, config=ServiceConfig(limits=Limits(send_timeout=0.05))))
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "root_path": "",
             "query_string": b"", "headers": [(b"content-type", b"application/json"), (b"host", b"localhost")],
             "client": ("127.0.0.1", 1), "server": ("localhost", 80)}
    sent: list[dict[str, Any]] = []
    request = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if request:
            return request.pop(0)
        await anyio.sleep_forever()  # the client never leaves: it only stopped reading
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if sum(m["type"] == "http.response.body" for m in sent) >= 2:
            await anyio.sleep_forever()  # the socket is full from here on
        sent.append(message)

    with anyio.fail_after(30):  # a safety net only: the 0.05 s send timeout ends it
        await app(scope, receive, send)  # type: ignore[arg-type]
    assert sent[0]["status"] == 200
    assert not any(m["type"] == "http.response.body" and not m.get("more_body", False) for m in sent)
    assert engine.closed_streams == 1 and not engine.active


# Valid raw in JSON, but line breaks to str.splitlines() (requests' iter_lines(decode_unicode=True))
LINE_BREAKS = "\u2028\u2029\u0085"


def test_line_safe_escapes_only_the_three_unicode_line_breaks() -> None:
    frame = 'data: {"t":"a\u2028b\u2029c\u0085d \u201cq\u201d \u00e9"}\n\n'.encode()
    escaped = line_safe(frame)
    assert escaped == b'data: {"t":"a\\u2028b\\u2029c\\u0085d ' + "\u201cq\u201d \u00e9".encode() + b'"}\n\n'
    assert json.loads(escaped.decode()[6:]) == json.loads(frame.decode()[6:])
    plain, accented = b'data: {"t":"hi"}\n\n', 'data: {"t":"caf\u00e9"}\n\n'.encode()
    assert line_safe(plain) is plain and line_safe(accented) is accented  # per token: nothing copied when none is there


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 1}),
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/responses", {"input": "hi"}),
    ("/v1/messages", {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 32}),
])
def test_every_streamed_event_survives_splitlines(client: Any, fake_engine: FakeEngine, path: str,
                                                  body: dict[str, Any]) -> None:
    fake_engine.pieces = ["a\u2028", "b\u2029", "c\u0085", "d"]
    response = client.post(path, json={**body, "stream": True})
    assert response.status_code == 200, response.text
    data = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    events = [json.loads(line) for line in data if line != "[DONE]"]  # a cut line is no JSON
    assert events and not any(char in response.text for char in LINE_BREAKS)
    assert any(LINE_BREAKS[0] in json.dumps(event, ensure_ascii=False) for event in events)


@pytest.mark.anyio
@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/responses", {"input": "hi"}),
    ("/v1/messages", {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 32}),
])
async def test_a_stream_to_an_http_1_0_client_says_the_connection_closes(path: str, body: dict[str, Any]) -> None:
    # HTTP/1.0 has no chunking: the body ends as the connection closes. With `connection: keep-alive` asked (ab -k),
    # the stream said keep-alive and the client's next request went to the socket being closed (RFC 9112 9.3).
    from service.app import create_app
    from service.state import AppState

    app = create_app(AppState(engine=FakeEngine(), ready=True))
    raw = json.dumps({**body, "stream": True}).encode()
    for version in ("1.0", "1", "1.1"):  # granian names HTTP/1.0 "1"
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": version, "method": "POST",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
                 "headers": [(b"content-type", b"application/json"), (b"host", b"localhost"),
                             (b"connection", b"keep-alive")],
                 "client": ("127.0.0.1", 1), "server": ("localhost", 80)}
        sent: list[dict[str, Any]] = []
        request = [{"type": "http.request", "body": raw, "more_body": False}]
        ended = anyio.Event()

        async def receive() -> dict[str, Any]:
            if request:
                return request.pop(0)
            await ended.wait()  # the client leaves once the body is whole
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                ended.set()

        with anyio.fail_after(30):
            await app(scope, receive, send)  # type: ignore[arg-type]
        start = sent[0]
        headers = {k.lower(): v for k, v in start["headers"]}
        assert start["status"] == 200 and headers[b"content-type"].startswith(b"text/event-stream")
        assert b"content-length" not in headers
        assert headers.get(b"connection") == (None if version == "1.1" else b"close"), (version, headers)
        assert sent[-1]["type"] == "http.response.body" and not sent[-1].get("more_body", False)
