"""`tandem serve --isolate` as users run it: speech served by the engine process (files and live sessions
through the routes of the API process), then the engine process killed (kill -9) mid-stream: the stream ends
with an error event and [DONE]; /health says restarting and new requests get 503 with Retry-After until the
new engine process is ready; then requests succeed again, and sessions of the dead process are gone (404).
A live Realtime session whose engine process dies gets an error event and a close (1013, try again later)."""

from __future__ import annotations

import base64
import json
import os
import signal
import time
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import TandemServer, start_tandem_server

NO_EOS = {str(t): -100 for t in range(3)}
OPEN_SESSIONS: list[str] = []  # sessions the speech test leaves open (the tests share one server, in order)  # the tiny tokenizer's special tokens: rows run to max_tokens


@pytest.fixture(scope="module")
def isolated_server(tiny_llm_dir: Path) -> Iterator[TandemServer]:
    server = start_tandem_server(str(tiny_llm_dir), "--isolate")
    try:
        yield server
    finally:
        server.stop()


def s16(seconds: float) -> bytes:
    t = np.arange(int(seconds * 16000)) / 16000
    return ((0.3 * np.sin(2 * np.pi * 220 * t) * (t % 0.5 < 0.3)) * 32767).astype("<i2").tobytes()


def test_speech_runs_in_the_engine_process(isolated_server: TandemServer) -> None:
    files = {"file": ("tone.raw", s16(1.5), "audio/pcm;rate=16000;encoding=s16le")}
    file = httpx.post(f"{isolated_server.base_url}/audio/transcriptions", files=files, data={"model": "whisper-1"},
                      timeout=120)
    assert file.status_code == 200 and "text" in file.json()
    session = httpx.post(f"{isolated_server.base_url}/audio/sessions", json={}, timeout=30).json()
    appended = httpx.post(f"{isolated_server.base_url}/audio/sessions/{session['id']}/audio", content=s16(1.0),
                          headers={"content-type": "audio/pcm;rate=16000;encoding=s16le"}, timeout=30)
    assert appended.status_code == 200 and appended.json()["received_seconds"] == 1.0
    OPEN_SESSIONS.append(session["id"])  # the next test kills the process holding it
    assert isolated_server.stats()["gc_engine_process"]["frozen_objects"] > 10_000  # frozen there too


def test_the_engine_process_killed_mid_stream(isolated_server: TandemServer) -> None:
    before = isolated_server.stats()["isolate"]
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1900, "stream": True,
            "logit_bias": NO_EOS}
    events = []
    with httpx.stream("POST", f"{isolated_server.base_url}/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        killed = False
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if not killed and '"content"' in line and '"role"' not in line:
                os.kill(before["pid"], signal.SIGKILL)  # the row is decoding: kill its engine
                killed = True
    assert events[-1] == "[DONE]"
    assert "engine process exited" in json.loads(events[-2])["error"]["message"]

    saw_restarting = False
    deadline = time.monotonic() + 120  # a guard against hanging, not synchronisation
    while time.monotonic() < deadline:
        health = httpx.get(f"{isolated_server.root}/health", timeout=10)
        if health.status_code == 200:
            break
        assert health.json()["status"] == "restarting"
        if not saw_restarting:
            saw_restarting = True
            refused = httpx.post(f"{isolated_server.base_url}/chat/completions", timeout=10,
                                 json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
            if refused.status_code == 503:  # unless the new engine became ready in between
                assert refused.headers["retry-after"] and refused.json()["error"]["code"] == "engine_restarting"
        time.sleep(0.1)
    assert saw_restarting  # loading the model again takes seconds: the first poll sees it
    after = isolated_server.stats()["isolate"]
    assert after["restarts"] == before["restarts"] + 1 and after["pid"] != before["pid"]
    answer = httpx.post(f"{isolated_server.base_url}/chat/completions", timeout=60,
                        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "logit_bias": NO_EOS})
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
    files = {"file": ("tone.raw", s16(1.0), "audio/pcm;rate=16000;encoding=s16le")}
    again = httpx.post(f"{isolated_server.base_url}/audio/transcriptions", files=files, data={"model": "whisper-1"},
                       timeout=120)
    assert again.status_code == 200  # the new engine process serves speech too
    for gone in OPEN_SESSIONS:  # their audio was in the process that died
        finish = httpx.post(f"{isolated_server.base_url}/audio/sessions/{gone}/finish", timeout=30)
        assert finish.status_code == 404 and finish.json()["error"]["code"] == "session_not_found"


def test_a_live_session_whose_engine_process_dies_ends_with_an_error_event_and_a_close(
        isolated_server: TandemServer) -> None:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    pid = isolated_server.stats()["isolate"]["pid"]
    url = f"ws://127.0.0.1:{isolated_server.port}/v1/realtime?intent=transcription"
    events = []
    with connect(url, open_timeout=30) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
        ws.send(json.dumps({"type": "input_audio_buffer.append", "event_id": "mine",
                            "audio": base64.b64encode(s16(0.5)).decode()}))
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ConnectionClosed) as closed:
            while True:  # recv's timeout: a guard against hanging
                events.append(json.loads(ws.recv(timeout=60)))
    errors = [e["error"] for e in events if e["type"] == "error"]
    assert errors and errors[-1]["code"] == "engine_restarting"
    assert errors[-1]["event_id"] is None  # not an answer to the client's last event
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
    deadline = time.monotonic() + 120  # a guard against hanging, not synchronisation
    while time.monotonic() < deadline and httpx.get(f"{isolated_server.root}/health", timeout=10).status_code != 200:
        time.sleep(0.1)
    with connect(url, open_timeout=30) as ws:  # the new engine process serves live sessions
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
