"""Host names a keyless loopback server answers (service/http/auth.py host_allowed)."""

from __future__ import annotations

import socket

import pytest

from service.http.auth import host_allowed, is_loopback


def _scope(host: str | None) -> dict[str, object]:
    return {"headers": [] if host is None else [(b"host", host.encode())]}


@pytest.mark.parametrize("host", ["localhost:8080", "127.0.0.1:8080", "127.3.4.5", "[::1]:8080", "LOCALHOST",
                                  "app.localhost:5173", "testserver.local", "box.internal", "192.168.1.20:8080",
                                  "10.0.0.7", "0.0.0.0:8080", "localhost.:8080", "testserver", "tandem:8080", None, ""])
def test_names_of_this_machine_pass(host: str | None) -> None:
    assert host_allowed(_scope(host), "127.0.0.1", keyed=False, allowed=[])


@pytest.mark.parametrize("host", ["rebind.attacker.example:8080", "attacker.example", "8.8.8.8", "[2606:4700::1111]:80",
                                  "evil.localhost.example.com"])
def test_other_names_are_refused_by_a_keyless_loopback_server(host: str) -> None:
    assert not host_allowed(_scope(host), "127.0.0.1", keyed=False, allowed=[])
    assert not host_allowed(_scope(host), "localhost", keyed=False, allowed=[])


def test_this_machines_hostname_and_listed_names_pass() -> None:
    assert host_allowed(_scope(f"{socket.gethostname()}:8080"), "127.0.0.1", keyed=False, allowed=[])
    assert host_allowed(_scope("proxy.example:443"), "127.0.0.1", keyed=False, allowed=["Proxy.Example"])
    assert host_allowed(_scope("anything.example"), "127.0.0.1", keyed=False, allowed=["*"])


def test_a_keyed_server_or_one_listening_beyond_loopback_answers_any_name() -> None:
    # A rebound page cannot guess a key; a server on 0.0.0.0 was meant to be reached by whatever name.
    assert host_allowed(_scope("rebind.attacker.example"), "127.0.0.1", keyed=True, allowed=[])
    assert host_allowed(_scope("rebind.attacker.example"), "0.0.0.0", keyed=False, allowed=[])


def test_is_loopback() -> None:
    assert is_loopback("localhost") and is_loopback("127.0.0.1") and is_loopback("[::1]")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.com")
