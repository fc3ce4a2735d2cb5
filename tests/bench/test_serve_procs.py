"""bench/serve_procs.py: a server under test is never confused with one already listening on its port."""

from __future__ import annotations

import socket
import subprocess
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


@pytest.mark.skipif(sys.platform != "linux", reason="LD_PRELOAD is how the peer gets the BLAS on Linux")
def test_the_cpu_peer_gets_the_fast_blas_even_when_mlx_is_imported_after_the_bench() -> None:
    from engine.backend import blas_info

    if blas_info().name != "openblas":
        pytest.skip("no OpenBLAS on this machine: the peer keeps MLX's own BLAS either way")
    # A fresh process, as `python -m bench.serve` runs: the demo model's conversion imports MLX before the peer starts.
    code = ("import bench.serve as s, mlx.core, engine.models; "
            "print(s._peer_env().get('LD_PRELOAD', ''))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert blas_info().path is not None and blas_info().path in out.stdout
