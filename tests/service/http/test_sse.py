"""EventSource releases its resource however streaming ends; run_while_connected follows the client."""

from __future__ import annotations

from typing import Any, AsyncGenerator

import anyio
import pytest

from service.http.disconnect import ClientDisconnected, run_while_connected
from service.http.sse import EventSource


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
