"""pi against mlx-tandem: recorded pi requests replayed, prefix-cache reuse across turns, and the real
pi CLI (from npm) in print mode, which must print the answer and exit 0."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from litestar.testing import TestClient

from engine.context import EngineThread
from engine.prefix_cache import PrefixCache
from engine.runtime import Engine
from service.app import create_app
from service.state import AppState
from tests.fixtures.pi_requests import ANSWER_TEXT, build_tool_llm, load_scripted, recorded_turns

REPO = Path(__file__).resolve().parents[2]
PI_PACKAGE = "@mariozechner/pi-coding-agent"


@pytest.fixture(scope="module")
def tool_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tool_llm(tmp_path_factory.mktemp("tool_llm"))


def _load(loader: Any, directory: Path) -> Any:
    thread = EngineThread("load")
    try:
        return thread.call(loader, directory)
    finally:
        thread.close()


def _client(loaded: Any, cache_bytes: int) -> TestClient[Any]:
    engine = Engine(loaded, prefix_cache=PrefixCache(cache_bytes))
    return TestClient(create_app(AppState(engine=engine)))


@pytest.fixture(scope="module")
def scripted(tool_model_dir: Path) -> Iterator[TestClient[Any]]:
    with _client(_load(load_scripted, tool_model_dir), 1 << 30) as client:
        yield client


def _events(body: str) -> list[Any]:
    events = []
    for block in body.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            payload = block[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def _check_grammar(events: list[Any]) -> dict[str, Any]:
    """Validate the chunk grammar; return the reassembled reply, finish_reason and usage."""
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    chunks = events[:-1]
    assert all("error" not in c for c in chunks), chunks
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    usage, chunks = chunks[-1], chunks[:-1]
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] > 0
    finishes = [i for i, c in enumerate(chunks) if c["choices"][0]["finish_reason"] is not None]
    assert finishes == [len(chunks) - 1], "exactly one finish_reason, on the last choice chunk"
    content, reasoning, calls = "", "", {}
    for chunk in chunks:
        delta = chunk["choices"][0]["delta"]
        content += delta.get("content") or ""
        reasoning += delta.get("reasoning_content") or ""
        for call in delta.get("tool_calls") or []:
            slot = calls.setdefault(call["index"], {"id": None, "name": "", "arguments": ""})
            if call.get("id"):
                assert slot["id"] in (None, call["id"]), "tool-call ids are stable"
                slot["id"] = call["id"]
            fn = call.get("function") or {}
            if fn.get("name"):
                assert not slot["name"] and not slot["arguments"], "the name comes first, once"
                slot["name"] = fn["name"]
            slot["arguments"] += fn.get("arguments") or ""
    return {
        "content": content,
        "reasoning": reasoning,
        "tool_calls": [calls[i] for i in sorted(calls)],
        "finish_reason": chunks[-1]["choices"][0]["finish_reason"],
        "usage": usage["usage"],
    }


def test_recorded_pi_turns_replay(scripted: TestClient[Any]):
    turns = recorded_turns()
    replies = []
    for turn in turns:
        response = scripted.post("/v1/chat/completions", json=turn["body"], headers=turn["headers"])
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/event-stream")
        replies.append(_check_grammar(_events(response.text)))

    first = replies[0]
    assert first["finish_reason"] == "tool_calls"
    (call,) = first["tool_calls"]
    assert call["id"].startswith("call_") and call["name"] == "read"
    assert json.loads(call["arguments"]) == {"path": "notes.txt"}
    assert "<tool_call>" not in first["content"] and "tool_call" not in first["reasoning"]
    assert first["reasoning"].strip() == "Let me look."  # thinking on (chat_template_kwargs.enable_thinking)
    for reply in replies[1:]:
        assert reply["finish_reason"] == "stop" and reply["content"] == ANSWER_TEXT and not reply["tool_calls"]
    # Each turn continues the previous one: the shared prefix comes from the cache.
    for previous, reply in zip(replies, replies[1:]):
        assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] >= previous["usage"]["prompt_tokens"] // 2
    stats = scripted.get("/stats").json()["prefix_cache"]
    assert stats["hits"] >= 2 and stats["entries"] >= 1 and stats["bytes"] > 0


def test_non_streamed_reply_carries_tool_calls(scripted: TestClient[Any]):
    body = dict(recorded_turns()[0]["body"], stream=False)
    body.pop("stream_options")
    # A new question: the scripted model must see the header, not just one token after a full cache hit.
    body["messages"] = body["messages"][:-1] + [{"role": "user", "content": "Read my notes, please."}]
    response = scripted.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "read" and json.loads(call["function"]["arguments"]) == {"path": "notes.txt"}
    assert not choice["message"].get("content")
    assert choice["message"]["reasoning_content"].strip() == "Let me look."


def test_thinking_off_gives_no_reasoning(scripted: TestClient[Any]):
    body = dict(recorded_turns()[0]["body"], reasoning_effort="none", tools=[])
    body["chat_template_kwargs"] = {}
    body["messages"] = body["messages"][:-1] + [{"role": "user", "content": "Hello there."}]
    reply = _check_grammar(_events(scripted.post("/v1/chat/completions", json=body).text))
    assert reply["reasoning"] == "" and reply["content"] == ANSWER_TEXT


def test_second_turn_reuses_first_and_matches_a_cold_run(tool_model_dir: Path):
    from engine.models import load_model

    loaded = _load(lambda d: load_model(str(d), float32=True), tool_model_dir)
    system = {"role": "system", "content": "You are a careful assistant. " * 20}
    first = [system, {"role": "user", "content": "The quick brown fox?"}]
    params = {"temperature": 0, "max_tokens": 8, "stream": False}
    with _client(loaded, 1 << 30) as warm:
        r1 = warm.post("/v1/chat/completions", json={"messages": first, **params}, headers={"session_id": "s"}).json()
        second = first + [
            {"role": "assistant", "content": r1["choices"][0]["message"]["content"] or ""},
            {"role": "user", "content": "And the lazy dog?"},
        ]
        r2 = warm.post("/v1/chat/completions", json={"messages": second, **params}, headers={"session_id": "s"}).json()
    with _client(loaded, 0) as cold:
        r2_cold = cold.post("/v1/chat/completions", json={"messages": second, **params}).json()
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] >= r1["usage"]["prompt_tokens"]
    assert r2_cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert r2["choices"][0]["message"] == r2_cold["choices"][0]["message"]
    assert r2["usage"]["completion_tokens"] == r2_cold["usage"]["completion_tokens"]


# ---------------------------------------------------------------- the real pi CLI


def _pi_binary() -> Path:
    """pi from npm, installed once under ~/.cache/mlx-tandem/pi (TANDEM_PI_CACHE); skips when unavailable."""
    cache = Path(os.environ.get("TANDEM_PI_CACHE", Path.home() / ".cache" / "mlx-tandem" / "pi"))
    binary = cache / "node_modules" / ".bin" / "pi"
    if binary.exists():
        return binary
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.skip("npm/node not available")
    cache.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run([npm, "install", "--prefix", str(cache), "--no-audit", "--no-fund", PI_PACKAGE],
                              capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.skip("npm install timed out (offline?)")
    if done.returncode != 0 or not binary.exists():
        pytest.skip(f"npm install {PI_PACKAGE} failed (offline?): {done.stderr[-500:]}")
    return binary


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(port: int, process: subprocess.Popen[Any], timeout: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the server exited during startup"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)  # polling another process's port: nothing to wait on but the socket
    raise AssertionError("server not ready")


def test_pi_print_mode_prints_the_answer_and_exits(tmp_path: Path):
    pi = _pi_binary()
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.fixtures.pi_requests.serve_scripted", str(tmp_path / "model"), str(port)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        _wait_healthy(port, server)
        work = tmp_path / "work"
        work.mkdir()
        (work / "notes.txt").write_text("remember the milk\n")
        env = dict(os.environ, PI_CODING_AGENT_DIR=str(tmp_path / "agent"), TANDEM_PI_BIN=str(pi),
                   PYTHONPATH=str(REPO), PI_OFFLINE="1", PI_SKIP_VERSION_CHECK="1", PI_TELEMETRY="0")
        # `tandem pi` writes the provider, finds the running server and execs pi -p: one tool call
        # (read notes.txt, run by pi), then the answer. pi must exit on its own.
        done = subprocess.run(
            [sys.executable, "-m", "service.cli", "pi", "--port", str(port), "-p", "What do my notes say?"],
            cwd=work, env=env, capture_output=True, text=True, timeout=300,
        )
        assert done.returncode == 0, done.stderr
        assert ANSWER_TEXT in done.stdout
        models = json.loads((tmp_path / "agent" / "models.json").read_text())
        assert models["providers"]["mlx-tandem"]["baseUrl"] == f"http://127.0.0.1:{port}/v1"
    finally:
        server.terminate()
        server.wait(timeout=30)
