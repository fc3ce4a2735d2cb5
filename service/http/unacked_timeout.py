"""Connections whose client stopped reading are dropped by the kernel after the send timeout (TCP_USER_TIMEOUT).

When a stream's client reads nothing for `--send-timeout`, the stream ends (service/http/sse.py), but granian keeps
the socket open to flush what it holds: a hostile client that never reads pinned a connection and ~3 MB of kernel
send buffer each, for as long as it liked (up to `--max-connections` of them). ASGI gives no way to abort a
connection and granian has no write timeout, so the kernel does it: TCP_USER_TIMEOUT bounds how long sent data may
stay unacknowledged (zero-window probes included) before the connection is reset. Set on granian's listening socket,
which a worker builds after the app starts, it is inherited by every connection accepted later; connections already
open get it too. Linux only; elsewhere nothing changes.
"""

from __future__ import annotations

import os
import socket

__all__ = ["apply_user_timeout"]

_TCP_FAMILIES = (socket.AF_INET, socket.AF_INET6)


def apply_user_timeout(seconds: float, fd_dir: str = "/proc/self/fd") -> tuple[int, int]:
    """Set TCP_USER_TIMEOUT to `seconds` on this process's TCP sockets: (listening sockets, connections) set. A
    process without /proc or the option sets none. Raises nothing."""
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is None or seconds <= 0:
        return 0, 0
    try:
        fds = [int(name) for name in os.listdir(fd_dir)]
    except (OSError, ValueError):
        return 0, 0
    listening = connected = 0
    for fd in fds:
        try:  # a duplicate: closing it leaves the process's own descriptor alone; options are the socket's
            dup = os.dup(fd)
        except OSError:  # already closed
            continue
        try:
            sock = socket.socket(fileno=dup)
        except OSError:  # not a socket
            os.close(dup)
            continue
        try:
            if sock.type != socket.SOCK_STREAM or sock.family not in _TCP_FAMILIES:
                continue
            sock.setsockopt(socket.IPPROTO_TCP, option, int(seconds * 1000))
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                listening += 1
            else:
                connected += 1
        except OSError:
            continue
        finally:
            sock.close()
    return listening, connected
