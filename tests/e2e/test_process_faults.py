"""A real `tandem serve` (default mode: the engine in the granian worker) under process faults and slow
clients, over real sockets: a worker killed mid-stream is respawned with its model; SIGTERM drains and
ends streams with their final events; a killed main process takes its worker with it; 1,100 stalled
request bodies do not make /health wait."""

from __future__ import annotations

import os
import select
import signal
import socket
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from tokenizers import Tokenizer

from tests.e2e.conftest import READY_MARKER, TandemServer, start_tandem_server

MESSAGES = [{"role": "user", "content": "Tell me a long story."}]
# Bounds that only catch a hang; nothing here measures speed.
HANG = 120.0


@pytest.fixture(scope="module")
def no_eos(tiny_llm_dir: Path) -> dict[str, int]:
    tokenizer = Tokenizer.from_file(str(tiny_llm_dir / "tokenizer.json"))
    return {str(tokenizer.token_to_id("<|im_end|>")): -100}


def _long_stream(server: TandemServer, no_eos: dict[str, int]) -> Any:
    body = {"messages": MESSAGES, "stream": True, "max_tokens": 2000, "logit_bias": no_eos}
    return httpx.stream("POST", f"{server.base_url}/chat/completions", json=body, timeout=HANG)


def _wait_exit(pid: int, timeout: float) -> bool:
    """Wait (on a pidfd, no polling) until process `pid` — not our child — exits."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
        return bool(readable)
    finally:
        os.close(fd)


@pytest.fixture
def server(tiny_llm_dir: Path) -> Iterator[TandemServer]:
    server = start_tandem_server(str(tiny_llm_dir), "--no-whisper", "--shutdown-timeout", "0.2")
    try:
        yield server
    finally:
        server.stop()


def test_a_killed_worker_comes_back_and_sigterm_ends_streams_with_their_final_events(
        server: TandemServer, no_eos: dict[str, int]) -> None:
    worker = server.worker_pid()
    with _long_stream(server, no_eos) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        os.kill(worker, signal.SIGKILL)  # the process holding the model dies mid-stream
        rest: list[str] = []
        with pytest.raises(httpx.HTTPError):
            rest.extend(lines)  # the stream ends: the connection is gone
        assert "data: [DONE]" not in rest
    # While it restarts the main process keeps the port: a client waits in its backlog, then gets 200 or 503 with
    # Retry-After, never a refused connection (granian's per-worker socket on Linux closed the port ~2.6 s).
    assert _wait_exit(worker, HANG)
    during = httpx.get(f"{server.root}/health", timeout=HANG)
    assert during.status_code == 200 or (during.status_code == 503 and during.headers["retry-after"])
    assert server.wait_for_line(READY_MARKER, count=2), server.output()
    assert server.worker_pid() != worker
    again = httpx.post(f"{server.base_url}/chat/completions", json={"messages": MESSAGES, "max_tokens": 4},
                       timeout=HANG)
    assert again.status_code == 200

    with _long_stream(server, no_eos) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        server.process.send_signal(signal.SIGTERM)
        events = [line for line in lines if line.startswith("data:")]
    assert events[-1] == "data: [DONE]"
    assert '"code": "shutting_down"' in events[-2]
    assert server.process.wait(timeout=HANG) == 0, server.output()


def test_killing_the_main_process_takes_the_worker_with_it(tiny_llm_dir: Path) -> None:
    server = start_tandem_server(str(tiny_llm_dir), "--no-whisper")
    try:
        worker = server.worker_pid()
        server.process.kill()
        server.process.wait(timeout=HANG)
        assert _wait_exit(worker, HANG), "the worker outlived its supervisor"
        with socket.socket() as probe:  # nothing holds the port any more
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", server.port))
            probe.listen()
    finally:
        server.stop()


def test_stalled_clients_do_not_make_health_wait(tiny_server: TandemServer) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if min(hard, 4096) < 1300:
        pytest.skip(f"needs ~1,300 open files, the limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    stalled: list[socket.socket] = []
    try:
        for i in range(1100):
            sock = socket.create_connection(("127.0.0.1", tiny_server.port), timeout=HANG)
            if i % 2:  # a body that never comes
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 100000\r\n\r\n{\"messages\": ")
            else:  # headers that never end
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            stalled.append(sock)
        health = httpx.get(f"{tiny_server.root}/health", timeout=HANG)
        assert health.status_code == 200
        chat = httpx.post(f"{tiny_server.base_url}/chat/completions", json={"messages": MESSAGES, "max_tokens": 2},
                          timeout=HANG)
        assert chat.status_code == 200
    finally:
        for sock in stalled:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(tiny_server: TandemServer) -> None:
    # Granian's protocol sniffing once kept such sockets forever: 2,000 of them took every descriptor. A kept-alive
    # connection idle after its request is closed the same way.
    silent = socket.create_connection(("127.0.0.1", tiny_server.port), timeout=HANG)
    kept = socket.create_connection(("127.0.0.1", tiny_server.port), timeout=HANG)
    try:
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert kept.recv(4096).startswith(b"HTTP/1.1 200")
        for sock in (silent, kept):
            ready, _, _ = select.select([sock], [], [], HANG)  # the default header timeout is 10 s
            assert ready and sock.recv(1) == b"", "the server kept an idle connection open"
    finally:
        silent.close()
        kept.close()
