"""`--isolate` in-process: chat through an engine in a child process, and engine errors keeping their type
across the boundary. The engine process killed mid-stream is tests/e2e/test_isolate.py (a real server)."""

from __future__ import annotations

import os
from typing import Any, Iterator

import pytest
from litestar.testing import TestClient

from audio.errors import InvalidOption, SessionExpired, SessionLimit, SessionShareLimit
from engine.errors import ContextTooLong, EngineRestarting, MemoryAdmission
from service.app import create_app
from service.config import ServiceConfig
from service.isolate.messages import ErrorInfo
from service.isolate.remote import RemoteEngine, open_isolated_engine
from service.state import AppState
from tests.service.conftest import sse_events

NO_EOS = {str(t): -100 for t in range(3)}  # the tiny tokenizer's special tokens: the row runs to max_tokens


@pytest.fixture(scope="module")
def isolated(tiny_llm_dir: Any) -> Iterator[TestClient[Any]]:
    config = ServiceConfig(model=str(tiny_llm_dir), isolate=True, warmup=False)
    with TestClient(create_app(AppState(config=config, load_engine=open_isolated_engine))) as client:
        yield client


def engine_of(client: TestClient[Any]) -> RemoteEngine:
    engine = client.app.state["tandem"].engine
    assert isinstance(engine, RemoteEngine)
    return engine


def chat(client: TestClient[Any], **body: Any) -> Any:
    return client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hello"}],
                                                     "max_tokens": 6, **body})


def test_chat_runs_in_another_process(isolated: TestClient[Any]) -> None:
    engine = engine_of(isolated)
    assert engine.pid is not None and engine.pid != os.getpid()
    events = sse_events(chat(isolated, stream=True, logit_bias=NO_EOS,
                             stream_options={"include_usage": True}).text)
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 6
    assert chat(isolated, logit_bias=NO_EOS).json()["usage"]["completion_tokens"] == 6  # EOS banned: exactly 6
    # /v1/models' `root` (vLLM's: where the model comes from) crosses the boundary too.
    assert isolated.get("/v1/models").json()["data"][0]["root"] == str(engine.config.model) == engine.model_root
    assert engine.max_model_len == engine.context_length == 2048  # what a request can use crosses it too


def test_log_probabilities_cross_the_process_boundary(isolated: TestClient[Any]) -> None:
    body = chat(isolated, logit_bias=NO_EOS, logprobs=True, top_logprobs=2, temperature=0).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 6 and all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in content)
    # Greedy: each token is its own likeliest (the bias moved no token the model would pick here).
    assert all(e["top_logprobs"][0]["token"] == e["token"] for e in content)
    assert "".join(e["token"] for e in content) == body["choices"][0]["message"]["content"]


@pytest.mark.parametrize("error", [ContextTooLong("too long", param="prompt"),
                                   MemoryAdmission("no room", code="context_over_budget", param="max_tokens"),
                                   EngineRestarting("later", retry_after=7),
                                   SessionLimit("too many sessions", code="session_limit"),
                                   SessionShareLimit("this key holds its share", retry_after=37),
                                   SessionExpired("idle for the TTL"),
                                   InvalidOption("bad language", param="language", code="invalid_value")])
def test_engine_errors_cross_the_process_boundary_with_their_type(error: Exception) -> None:
    again = ErrorInfo.of(error).exception()
    assert type(again) is type(error) and str(again) == str(error)
    for name in ("param", "code", "retry_after"):
        assert getattr(again, name, None) == getattr(error, name, None)


@pytest.mark.anyio
async def test_once_the_relay_sees_the_engine_process_gone_requests_get_503_and_unanswered_rows_too(
        tiny_llm_dir: Any) -> None:
    # The relay thread notices the death first; until the event loop restarts the engine, nothing may be sent
    # to the dead process (a request would wait for its failure, a speech call would block the loop). Rows
    # that produced nothing end with EngineRestarting (503 + Retry-After: the client may send them again);
    # a row that already answered part ends with the error.
    import asyncio
    from multiprocessing import Pipe

    from engine.contracts import Delta, GenerationRequest

    engine = RemoteEngine(ServiceConfig(model=str(tiny_llm_dir), isolate=True, warmup=False))
    ours, theirs = Pipe()
    engine._conn, engine._connected, engine._state = ours, True, "ready"  # as start() leaves it
    waiting, answering = engine.submit(GenerationRequest([1, 2, 3])), engine.submit(GenerationRequest([4, 5]))
    answering.deliver(Delta(text="Hi"))
    theirs.close()  # the engine process dies
    engine._read(ours, asyncio.get_running_loop())  # the relay thread's loop: returns at the end of the connection
    assert engine.health()["status"] == "restarting"
    with pytest.raises(EngineRestarting):
        engine.submit(GenerationRequest([1]))
    engine._fail_streams("The engine process exited (status -9); it is restarting.", restarting=True)
    with pytest.raises(EngineRestarting, match="exited"):
        await waiting.__anext__()
    assert (await answering.__anext__()).text == "Hi"
    assert (await answering.__anext__()).error == "The engine process exited (status -9); it is restarting."


@pytest.mark.anyio
async def test_speech_calls_of_a_closed_engine_end_as_shutting_down_not_restarting(tiny_llm_dir: Any) -> None:
    # A graceful SIGTERM reached speech clients as a crash: a file got 503 engine_restarting, a live socket 1013.
    import asyncio
    from multiprocessing import Pipe

    import anyio

    from audio.errors import SpeechStopped
    from service.http.errors import api_error
    from service.isolate.objects import Ref

    engine = RemoteEngine(ServiceConfig(model=str(tiny_llm_dir), isolate=True, warmup=False))
    ours, theirs = Pipe()
    engine._conn, engine._connected, engine._state = ours, True, "ready"  # as start() leaves it
    speech = engine.objects.proxy(Ref(1, "SpeechService", {"transcribe": "await", "stats": "call"}))
    ended: list[BaseException] = []

    async def transcribe() -> None:
        try:
            await speech.transcribe([0.0], None)
        except Exception as exc:
            ended.append(exc)

    with anyio.fail_after(30):  # a hang guard, not a timing assertion
        async with anyio.create_task_group() as tg:
            tg.start_soon(transcribe)
            await anyio.wait_all_tasks_blocked()  # its call went out: it waits for the reply
            engine.close()  # the drain's end: the engine process is told to shut down
            theirs.close()  # and exits
            # the relay thread: returns at the end of the connection
            await anyio.to_thread.run_sync(engine._read, ours, asyncio.get_running_loop())
    assert len(ended) == 1 and isinstance(ended[0], SpeechStopped)
    assert (api_error(ended[0]).status, api_error(ended[0]).code) == (503, "shutting_down")
    with pytest.raises(SpeechStopped):  # later calls too (a live socket's cleanup)
        speech.stats()


@pytest.mark.anyio
async def test_stats_name_no_pid_while_the_engine_process_restarts(tiny_llm_dir: Any, monkeypatch: Any) -> None:
    # /stats went on naming the killed process while its successor started.
    engine = RemoteEngine(ServiceConfig(model=str(tiny_llm_dir), isolate=True, warmup=False))
    engine.pid, engine._state = 1234, "ready"
    seen: dict[str, Any] = {}

    async def start() -> None:  # the new process is still loading
        seen.update(engine.stats()["isolate"])

    monkeypatch.setattr(engine, "start", start)
    await engine._restart()
    assert (seen["state"], seen["pid"]) == ("restarting", None)


@pytest.mark.anyio
async def test_health_says_when_the_engine_process_stops_answering(tiny_llm_dir: Any, monkeypatch: Any) -> None:
    # A SIGSTOPped (or hung) engine process kept /health at 200 ok for as long as it stayed stopped: no exit to see.
    import asyncio
    import time
    from multiprocessing import Pipe

    import service.isolate.remote as remote
    from service.isolate.messages import Snapshot

    engine = RemoteEngine(ServiceConfig(model=str(tiny_llm_dir), isolate=True, warmup=False))
    ours, theirs = Pipe()
    engine._conn, engine._connected, engine._state, engine.pid = ours, True, "ready", 4321
    theirs.send(Snapshot({}, {"ok": True}))
    theirs.close()
    engine._read(ours, asyncio.get_running_loop())  # the snapshot arrives; the relay returns at the connection's end
    engine._state, engine._connected = "ready", True  # as if it were still connected
    assert engine.health() == {"ok": True}
    later = time.monotonic() + remote.SILENT_SECONDS + 1
    monkeypatch.setattr(remote.time, "monotonic", lambda: later)
    health = engine.health()
    assert health["ok"] is False and "pid 4321" in health["error"] and "not answered" in health["error"]


def test_the_engine_process_outlives_the_groups_ctrl_c_and_sigterm(isolated: TestClient[Any]) -> None:
    # Ctrl-C (SIGINT to the process group) and systemd's stop (SIGTERM to the group) killed the engine process at
    # once: streams ended as a crash, and the supervisor loaded a new engine while stopping. The API process's
    # drain decides when it stops (Shutdown, or the end of the connection).
    import re
    import signal
    import sys
    from pathlib import Path

    engine = engine_of(isolated)
    pid = engine.pid
    assert pid is not None
    if sys.platform.startswith("linux"):  # ignored, so the kernel drops them as they are sent: nothing pends
        ignored = int(re.findall(r"SigIgn:\s*([0-9a-f]+)", Path(f"/proc/{pid}/status").read_text())[0], 16)
        assert ignored >> (signal.SIGINT - 1) & 1 and ignored >> (signal.SIGTERM - 1) & 1, hex(ignored)
    os.kill(pid, signal.SIGINT)
    os.kill(pid, signal.SIGTERM)
    assert chat(isolated, logit_bias=NO_EOS).json()["usage"]["completion_tokens"] == 6
    assert (engine.pid, engine.restarts) == (pid, 0)


@pytest.mark.anyio
async def test_an_engine_process_that_exits_once_the_drain_began_is_not_restarted(tiny_llm_dir: Any,
                                                                                  monkeypatch: Any) -> None:
    # The supervisor started a new engine process (and reloaded the model) while the server was stopping.
    import subprocess
    import sys
    from multiprocessing import Pipe

    import anyio

    from engine.contracts import Delta, GenerationRequest

    engine = RemoteEngine(ServiceConfig(model=str(tiny_llm_dir), isolate=True, warmup=False))
    ours, theirs = Pipe()
    engine._conn, engine._connected, engine._state = ours, True, "ready"  # as start() leaves it
    engine._process = subprocess.Popen([sys.executable, "-c", "pass"])  # an engine process that exits
    started: list[str] = []

    async def start() -> None:
        started.append("a new engine process")
        engine._closed = True  # ends serve() without the fix too

    monkeypatch.setattr(engine, "start", start)
    running = engine.submit(GenerationRequest([1, 2, 3]))
    running.deliver(Delta(text="Hi"))
    engine.refuse_queued()  # the drain began
    theirs.close()  # and the engine process exited
    with anyio.fail_after(30):  # a hang guard, not a timing assertion
        await engine.serve()
    assert started == [] and engine.restarts == 0
    assert (await running.__anext__()).text == "Hi"
    assert "while stopping" in str((await running.__anext__()).error)
