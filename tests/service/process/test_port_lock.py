"""One server per port: the port lock refuses a second holder and frees the port when released."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.process.port_lock import PortBusy, lock_port, ports_dir


def test_a_second_lock_on_a_held_port_is_refused(tmp_path: Path) -> None:
    first = lock_port(18601, tmp_path)
    try:
        with pytest.raises(PortBusy):
            lock_port(18601, tmp_path)
        lock_port(18602, tmp_path).release()  # another port is free
    finally:
        first.release()
    lock_port(18601, tmp_path).release()  # released: the port can be taken again


def test_locks_live_in_the_runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert ports_dir() == tmp_path / "mlx-tandem" / "ports"


def test_an_unwritable_lock_dir_does_not_stop_the_server(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    lock = lock_port(18603, blocker / "ports")  # cannot mkdir under a file
    assert lock.fd is None
    lock.release()
