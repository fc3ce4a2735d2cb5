"""`tandem serve` start-up: one server per port, host names, and what it prints before the model loads."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from service.cli.main import main
from service.process.port_lock import lock_port


@pytest.fixture
def no_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """service.server.serve returns at once, and port locks live under tmp_path."""
    import service.server

    monkeypatch.setattr(service.server, "serve", lambda config: 0)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_second_server_on_a_port_is_refused_before_it_binds(tiny_llm_dir: Path, no_server: None, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # The first server holds the port's lock but granian has not bound yet: a bind check alone would pass.
    port = _free_port()
    first = lock_port(port, tmp_path / "mlx-tandem" / "ports")
    try:
        assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", str(port)]) == 2
    finally:
        first.release()
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"cannot listen on 127.0.0.1:{port}: Address already in use" in err, err


def test_the_port_is_free_again_after_a_server_stops(tiny_llm_dir: Path, no_server: None) -> None:
    port = _free_port()
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", str(port)]) == 0
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", str(port)]) == 0


def test_the_address_is_announced_as_starting_not_serving(tiny_llm_dir: Path, no_server: None,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # The model loads after this line: "serving on" followed by a load failure misled (bad_*.log).
    port = _free_port()
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", str(port), "--log-level", "warning"]) == 0
    err = capsys.readouterr().err
    assert f"starting on http://127.0.0.1:{port}/v1" in err and "serving on" not in err, err


def test_an_ipv6_address_is_announced_in_brackets(tiny_llm_dir: Path, no_server: None,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # "http://::1:PORT/v1" is no URL: copied into a client, it fails as an invalid port.
    port = _free_port()
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--host", "::1", "--port", str(port),
                 "--log-level", "warning"]) == 0
    assert f"starting on http://[::1]:{port}/v1" in capsys.readouterr().err


def test_a_broken_weights_file_is_one_line_before_any_worker(tiny_llm_dir: Path, no_server: None, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # An empty model.safetensors started a worker that failed with "[read] Unable to read 8 bytes from file."
    import shutil

    model = Path(shutil.copytree(tiny_llm_dir, tmp_path / "model"))
    weights = sorted(model.glob("*.safetensors"))[0]
    weights.write_bytes(b"")
    assert main(["serve", str(model), "--no-whisper", "--port", str(_free_port())]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{weights} is empty (0 bytes)" in err and "starting on" not in err, err


def test_a_host_name_is_served_on_the_address_it_resolves_to(tiny_llm_dir: Path, served: list[object],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # granian takes IP addresses only: `--host localhost` failed with "ValueError: invalid IP address syntax".
    import ipaddress

    port = _free_port()
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--host", "localhost", "--port", str(port),
                 "--log-level", "warning"]) == 0
    host = served[0].host  # type: ignore[attr-defined]
    assert ipaddress.ip_address(host).is_loopback, host
    err = capsys.readouterr().err
    assert "starting on http://" in err and "without an API key" not in err, err


def test_a_bracketed_ipv6_host_is_the_address_inside(tiny_llm_dir: Path, served: list[object],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # `--host [::1]`, as URLs write it, was "cannot resolve --host '[::1]'".
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    port = _free_port()
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--host", "[::1]", "--port", str(port),
                 "--log-level", "warning"]) == 0
    assert served[0].host == "::1"  # type: ignore[attr-defined]
    assert f"starting on http://[::1]:{port}/v1" in capsys.readouterr().err


def test_the_open_server_warning_judges_the_resolved_address(tiny_llm_dir: Path, served: list[object],
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    # A name of this machine that resolves to loopback is no open server (and keeps the Host guard, which reads
    # config.host); the name itself is not one is_loopback knows.
    real = socket.getaddrinfo
    port = _free_port()

    def resolve(host: str, *args: object, **kwargs: object) -> object:
        return real("127.0.0.1" if host == "box.example" else host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    monkeypatch.delenv("TANDEM_API_KEY", raising=False)
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--host", "box.example", "--port", str(port)]) == 0
    assert "without an API key" not in caplog.text, caplog.text
    assert served[0].host == "127.0.0.1"  # type: ignore[attr-defined]


def test_a_temporary_directory_mlx_cannot_compile_in_stops_the_start(tiny_llm_dir: Path, tmp_path: Path) -> None:
    # MLX's CPU backend builds kernels under TMPDIR: a missing one let the server report ready, then answer every
    # request with a 500. A fresh process: this one's kernels are compiled already.
    import os
    import subprocess
    import sys

    script = ("import service.server as s; s.serve = lambda config: 0; from service.cli.main import main; "
              f"raise SystemExit(main(['serve', {str(tiny_llm_dir)!r}, '--no-whisper', '--port', '{_free_port()}']))")
    env = {**os.environ, "TMPDIR": str(tmp_path / "gone"), "XDG_RUNTIME_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    err = done.stderr.strip()
    assert err.count("\n") == 0 and "MLX cannot compile its CPU kernels" in err and str(tmp_path / "gone") in err, err


def test_port_0_serves_a_free_port_the_start_line_names(tiny_llm_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `--port 0` was refused: a port granian picked would differ per worker (each binds it) and be named nowhere.
    import service.server
    from service.process.port_lock import PortBusy

    seen: dict[str, object] = {}

    def serve(config: object) -> int:
        port = config.port  # type: ignore[attr-defined]
        seen["port"] = port
        with pytest.raises(PortBusy):  # held for the server's life, as a port given by number is
            lock_port(port, tmp_path / "mlx-tandem" / "ports")
        if sys.platform == "linux":  # and reserved: nothing else binds it before the worker does
            with socket.socket() as other, pytest.raises(OSError):
                other.bind(("127.0.0.1", port))
        return 0

    monkeypatch.setattr(service.server, "serve", serve)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", "0", "--log-level", "warning"]) == 0
    port = seen["port"]
    assert isinstance(port, int) and 0 < port < 65536
    assert f"starting on http://127.0.0.1:{port}/v1" in capsys.readouterr().err
    lock_port(port, tmp_path / "mlx-tandem" / "ports").release()  # let go once it stops
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))
