"""bench/serve_procs.py: a server under test is never confused with one already listening on its port."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from bench.serve_procs import Server


def test_start_refuses_a_port_something_already_answers_on(tmp_path: Path) -> None:
    # A leftover server from an earlier run would pass wait_ready and be measured in place of the new one.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        server = Server("tandem", [sys.executable, "-c", "pass"], f"http://127.0.0.1:{port}", tmp_path / "s.log")
        with pytest.raises(RuntimeError, match="already listens"):
            server.start()
        assert server.proc is None  # nothing was spawned


def test_start_spawns_when_the_port_is_free(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: connections are refused
        server = Server("tandem", [sys.executable, "-c", "pass"], f"http://127.0.0.1:{port}", tmp_path / "s.log")
        server.start()
        try:
            assert server.proc is not None and server.proc.wait(timeout=30) == 0
        finally:
            server.stop()
