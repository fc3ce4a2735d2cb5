"""service/http/unacked_timeout.py: the process's listening TCP sockets and open connections get TCP_USER_TIMEOUT =
--send-timeout, once, at the guard's first request (granian's worker builds its listener after the app starts); a
connection accepted later inherits it, and the kernel resets one whose client reads nothing for that long."""

from __future__ import annotations

import errno
import os
import socket
import sys
from typing import Iterator

import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.config import ServiceConfig
from service.http import guard
from service.http.unacked_timeout import apply_user_timeout
from service.limits import Limits
from service.state import AppState
from tests.service.fake_engine import FakeEngine

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_USER_TIMEOUT is Linux's")


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock
    sock.close()


def _user_timeout_ms(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)


def test_listening_sockets_and_connections_get_the_timeout(listener: socket.socket) -> None:
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    unix = socket.socketpair()  # not TCP: left alone
    try:
        listening, connected = apply_user_timeout(7.5)
        assert listening >= 1 and connected >= 2
        assert [_user_timeout_ms(s) for s in (listener, client, accepted)] == [7500] * 3
        later = socket.create_connection(listener.getsockname())  # accepted after: inherited from the listener
        with later, listener.accept()[0] as accepted_later:
            assert _user_timeout_ms(accepted_later) == 7500
    finally:
        for s in (client, accepted, *unix):
            s.close()


def test_nothing_is_set_without_a_timeout_or_proc(listener: socket.socket) -> None:
    assert apply_user_timeout(0) == (0, 0) and apply_user_timeout(5, fd_dir="/no/such/dir") == (0, 0)
    assert _user_timeout_ms(listener) == 0


def test_a_connection_whose_client_reads_nothing_is_reset_by_the_kernel(listener: socket.socket) -> None:
    apply_user_timeout(0.5)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(listener.getsockname())
    server_side, _ = listener.accept()
    server_side.settimeout(5)
    with client, server_side:
        with pytest.raises(OSError) as reset:  # not the 5 s socket timeout: the kernel's reset
            while True:
                server_side.send(b"x" * 65536)
    assert reset.value.errno == errno.ETIMEDOUT


def test_the_guard_sets_it_at_its_first_request(listener: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []

    def counted(seconds: float) -> tuple[int, int]:
        calls.append(seconds)
        return apply_user_timeout(seconds)

    monkeypatch.setattr(guard, "apply_user_timeout", counted)
    state = AppState(engine=FakeEngine(), config=ServiceConfig(limits=Limits(send_timeout=42.0)))
    with TestClient(create_app(state)) as client:
        assert _user_timeout_ms(listener) == 0  # the app started: nothing yet
        assert client.get("/health").status_code == 200
        assert _user_timeout_ms(listener) == 42000
        assert client.get("/health").status_code == 200
    assert calls == [42.0]  # once: later requests do not scan again


def test_scanning_leaves_no_descriptor_behind() -> None:
    # Every app's guard scans once: a duplicate left open per non-socket descriptor ran a test process out of them.
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        apply_user_timeout(5)
    assert len(os.listdir("/proc/self/fd")) == before
