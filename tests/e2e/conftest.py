"""A real `tandem serve` subprocess on a free port, shared by the e2e tests of a session.

Readiness is an event, not a sleep: the server's log is read line by line until granian reports the
worker started (after the app's lifespan loaded the model), or the process exits.
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import httpx
import pytest

__all__ = ["TandemServer", "start_tandem_server", "tiny_server", "READY_MARKER"]

READY_MARKER = "ready: serving requests"  # service.app.READY_LINE, logged when the models are loaded
STARTUP_TIMEOUT_S = 180.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tandem_command() -> list[str]:
    script = Path(sys.executable).parent / "tandem"
    return [str(script)] if script.exists() else [sys.executable, "-m", "service.cli"]


@dataclass
class TandemServer:
    """A running server: `base_url` ends in /v1; `log` holds its output so far; `ca`: the CA of its certificate when
    it serves HTTPS."""

    process: subprocess.Popen[str]
    port: int
    ca: Path | None = None
    log: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)
    lines: threading.Condition = field(default_factory=threading.Condition)

    def add_line(self, line: str) -> None:
        with self.lines:
            self.log.append(line)
            self.lines.notify_all()

    def wait_for_line(self, text: str, count: int = 1, timeout: float = STARTUP_TIMEOUT_S) -> bool:
        """Block until `text` appeared in `count` log lines (or the process exited). Returns whether it did."""
        def seen() -> bool:
            return sum(text in line for line in self.log) >= count or self.process.poll() is not None

        with self.lines:
            self.lines.wait_for(seen, timeout)
            return sum(text in line for line in self.log) >= count

    def worker_pid(self) -> int:
        """The pid of the worker serving now (from /stats)."""
        return int(httpx.get(f"{self.root}/stats", timeout=10, verify=self.verify).json()["pid"])

    @property
    def root(self) -> str:
        return f"{'https' if self.ca else 'http'}://127.0.0.1:{self.port}"

    @property
    def verify(self) -> ssl.SSLContext:
        """What a client trusts to reach it: the system's CAs, or only its own CA."""
        return ssl.create_default_context(cafile=str(self.ca) if self.ca else None)

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    def stats(self) -> dict:
        return httpx.get(f"{self.root}/stats", timeout=10, verify=self.verify).json()

    def output(self) -> str:
        return "".join(self.log[-80:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def start_tandem_server(*args: str, env: dict[str, str] | None = None, ca: Path | None = None) -> TandemServer:
    """Start `tandem serve *args --port <free>` and wait until it serves (`ca`: it serves HTTPS with a certificate
    from that CA). Fails the test with the server's log when it exits or does not become ready in time."""
    port = _free_port()
    process = subprocess.Popen(
        [*_tandem_command(), "serve", *args, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
    )
    server = TandemServer(process, port, ca=ca)

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            server.add_line(line)
            if READY_MARKER in line:
                server.ready.set()
        server.ready.set()  # exited: wake the waiters, which then see the process is gone
        with server.lines:
            server.lines.notify_all()

    threading.Thread(target=pump, name=f"tandem-log-{port}", daemon=True).start()
    if not server.ready.wait(STARTUP_TIMEOUT_S) or process.poll() is not None:
        server.stop()
        pytest.fail(f"tandem serve did not start:\n{server.output()}")
    health = httpx.get(f"{server.root}/health", timeout=10, verify=server.verify)
    if health.status_code != 200:
        server.stop()
        pytest.fail(f"/health answered {health.status_code} after startup:\n{server.output()}")
    return server


@pytest.fixture(scope="session")
def tiny_server(tiny_llm_dir: Path) -> Iterator[TandemServer]:
    """`tandem serve <tiny model>` for the whole session."""
    server = start_tandem_server(str(tiny_llm_dir))
    try:
        yield server
    finally:
        server.stop()
