"""`tandem serve --isolate`, killed as users' machines kill things: the engine process dies (kill -9)
mid-stream. The stream ends with an error event and [DONE]; /health says restarting and new requests get
503 with Retry-After until the new engine process is ready; then requests succeed again."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.e2e.conftest import TandemServer, start_tandem_server

NO_EOS = {str(t): -100 for t in range(3)}  # the tiny tokenizer's special tokens: rows run to max_tokens


@pytest.fixture(scope="module")
def isolated_server(tiny_llm_dir: Path) -> Iterator[TandemServer]:
    server = start_tandem_server(str(tiny_llm_dir), "--isolate", "--no-whisper")
    try:
        yield server
    finally:
        server.stop()


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
                        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
