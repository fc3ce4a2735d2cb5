"""`tandem dictate` against a server that refuses: the key, the session, or the connection itself ends
as one line on stderr and exit 1, never an ExceptionGroup traceback."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.cli.main import main
from tests.service.cli.conftest import write_wav

Handler = Callable[[Any], Awaitable[None]]


@pytest.fixture
def wav(tmp_path: Path) -> Path:
    return write_wav(tmp_path / "a.wav", np.zeros(16000))


class _Server:
    """A websocket server on a thread of its own, running `handler` for each connection."""

    def __init__(self, handler: Handler, process_request: Any = None) -> None:
        self.handler, self.process_request = handler, process_request
        self.port = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Future[None] | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._main(),), daemon=True)

    async def _main(self) -> None:
        from websockets.asyncio.server import serve

        self._stop = self._loop.create_future()
        async with serve(self.handler, "127.0.0.1", 0, process_request=self.process_request) as server:
            self.port = next(iter(server.sockets)).getsockname()[1]
            self._ready.set()
            await self._stop

    def __enter__(self) -> str:
        self._thread.start()
        self._ready.wait(10)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set_result, None)
        self._thread.join(10)


def _dictate(server: str, wav: Path, *extra: str) -> list[str]:
    return ["dictate", str(wav), "--server", server, "--speed", "50", *extra]


async def _refuse_language(ws: Any) -> None:
    await ws.recv()  # session.update
    await ws.send(json.dumps({"type": "error", "error": {"message": "this Whisper model is English-only",
                                                          "code": "invalid_value"}}))
    await ws.close(1008, "invalid_value")


async def _close_at_once(ws: Any) -> None:
    await ws.recv()
    await ws.close(1008, "serves no Whisper model")


async def _drop_mid_run(ws: Any) -> None:
    await ws.recv()
    await ws.send(json.dumps({"type": "session.updated", "session": {}}))
    await ws.recv()  # the first chunk of audio
    ws.transport.abort()  # no close frame: the server went away


async def _close_normally_mid_run(ws: Any) -> None:
    await ws.recv()
    await ws.send(json.dumps({"type": "session.updated", "session": {}}))
    async for message in ws:
        if json.loads(message).get("type") == "input_audio_buffer.commit":
            await ws.close()  # a normal close while the take waits for its transcripts


@pytest.mark.parametrize("handler, words", [
    (_refuse_language, "refused the session: this Whisper model is English-only"),
    (_close_at_once, "closed the connection (code 1008: serves no Whisper model)"),
    (_drop_mid_run, "dropped the connection"),
    (_close_normally_mid_run, "closed the connection (code 1000"),
])
def test_a_refused_or_ended_session_is_one_line(handler: Handler, words: str, wav: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with _Server(handler) as server:
        code = main(_dictate(server, wav))
    err = capsys.readouterr().err
    assert code == 1
    assert words in err
    assert "Traceback" not in err and err.count("\n") <= 2, err


def _forbidden(http_status: int, message: str) -> Any:
    """The handshake answered 403, as the server does for any refusal; plain HTTP answers `http_status`."""
    def process_request(connection: Any, request: Any) -> Any:
        if "Upgrade" not in request.headers:
            return connection.respond(http_status, json.dumps({"error": {"message": message}}))
        return connection.respond(403, "")
    return process_request


@pytest.mark.parametrize("key, http_status, words", [
    (None, 401, "needs an API key (HTTP 403): pass --api-key or set TANDEM_API_KEY"),
    ("wrong", 401, "refused the API key"),
    ("k1", 503, "is not ready: The server is loading; retry shortly."),
])
def test_a_refused_handshake_names_its_cause(key: str | None, http_status: int, words: str, wav: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("TANDEM_API_KEY", raising=False)
    refusal = _forbidden(http_status, "The server is loading; retry shortly.")
    with _Server(_close_at_once, process_request=refusal) as server:
        code = main(_dictate(server, wav, *(["--api-key", key] if key else [])))
    err = capsys.readouterr().err
    assert code == 1 and words in err and "cannot reach" not in err, err
