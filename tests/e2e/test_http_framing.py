"""Requests as raw HTTP/1.1 bytes against a real `tandem serve` (granian): what the ASGI scope makes of framing the
app's own tests cannot show (granian fills in an empty Host for a request that sent none)."""

from __future__ import annotations

import json
import socket

from tests.e2e.conftest import TandemServer


def _raw(server: TandemServer, head: bytes) -> tuple[int, dict[str, object]]:
    """Send `head` (a request without a body) and read the whole answer (Connection: close). Raises OSError."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    body = rest.partition(b"\r\n\r\n")[2]
    return int(status_line.split()[1]), json.loads(body) if body.startswith(b"{") else {}


def test_http_1_1_without_host_or_with_two_is_a_400(tiny_server: TandemServer) -> None:
    status, body = _raw(tiny_server, b"GET /v1/models HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert status == 400 and body["error"]["code"] == "missing_host"  # type: ignore[index]
    status, body = _raw(tiny_server, b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n"
                                     b"Connection: close\r\n\r\n")
    assert status == 400 and body["error"]["code"] == "duplicate_host"  # type: ignore[index]
    status, _ = _raw(tiny_server, b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    assert status == 200
    status, _ = _raw(tiny_server, b"GET /v1/models HTTP/1.0\r\n\r\n")  # HTTP/1.0 may leave Host out
    assert status == 200
