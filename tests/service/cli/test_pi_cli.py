"""`tandem pi` (service/pi/command.py) against a server started with --api-key: the key comes from
--api-key or TANDEM_API_KEY, is sent to the server and written into pi's provider entry; a missing or
wrong key is named; a bad --port is named; Ctrl-C while waiting is one line."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from service.pi import command

KEY = "k1"


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path != "/health" and self.headers.get("Authorization") != f"Bearer {KEY}":
            self._json(401, {"error": {"message": "Invalid API key", "code": "invalid_api_key"}})
        elif self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/v1/pi/provider":
            self._json(200, {"providers": {"mlx-tandem": {
                "baseUrl": "http://x/v1", "apiKey": "mlx-tandem", "api": "openai-completions",
                "models": [{"id": "m", "contextWindow": 65536}]}}})
        else:
            self._json(404, {})

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    thread.join()


@pytest.fixture
def environ(tmp_path: Path) -> dict[str, str]:
    pi = tmp_path / "pi"
    pi.write_text("#!/bin/sh\n")
    return {"TANDEM_PI_BIN": str(pi), "PI_CODING_AGENT_DIR": str(tmp_path / "agent"), "PATH": "/usr/bin",
            "XDG_CACHE_HOME": str(tmp_path / "cache")}


def _run(argv: list[str], environ: dict[str, str]) -> tuple[int, list[list[str]]]:
    execs: list[list[str]] = []
    code = command.pi_command(argv, environ=environ, exec_fn=lambda pi, args, env: execs.append(args),
                              ready_timeout=5)
    return code, execs


def _written_key(environ: dict[str, str]) -> str:
    models = json.loads((Path(environ["PI_CODING_AGENT_DIR"]) / "models.json").read_text())
    return str(models["providers"]["mlx-tandem"]["apiKey"])


def test_the_key_option_reaches_the_server_and_the_provider_entry(port: int, environ: dict[str, str]) -> None:
    code, execs = _run(["--port", str(port), "--api-key", KEY, "-p", "hi"], environ)
    assert code == 0 and execs and execs[0][-2:] == ["-p", "hi"]
    assert _written_key(environ) == KEY


def test_the_key_comes_from_the_environment_too(port: int, environ: dict[str, str]) -> None:
    code, _ = _run(["--port", str(port)], {**environ, "TANDEM_API_KEY": f"{KEY},other"})
    assert code == 0 and _written_key(environ) == KEY


@pytest.mark.parametrize("key, words", [(None, "needs an API key"), ("wrong", "refused the API key")])
def test_a_missing_or_wrong_key_is_named(key: str | None, words: str, port: int, environ: dict[str, str],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, execs = _run(["--port", str(port), *(["--api-key", key] if key else [])], environ)
    err = capsys.readouterr().err
    assert code == 1 and not execs and words in err and "serves no chat model" not in err, err


def test_a_port_that_is_not_a_number_is_named(environ: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--port", "abc"], environ)[0] == 2
    assert "--port must be a number, got 'abc'" in capsys.readouterr().err


def test_ctrl_c_while_waiting_is_one_line(environ: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(base: str) -> bool:
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "_answers", interrupted)
    try:
        code = _run(["--port", "1"], environ)[0]
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped tandem pi as a traceback")
    assert code == 130
    assert "interrupted" in capsys.readouterr().err
