"""The port `tandem serve` listens on, claimed before any worker starts: the per-port lock (one server per port),
a bind check that turns a busy or unknown address into one line, and `--port 0`, a free port chosen here and then
served on: granian's workers each bind the port themselves (Linux), and a respawned one again, so a 0 handed to
granian would be a different port for each and none the banner could name."""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from typing import Any

from service.cli.errors import CLIError
from service.process.port_lock import PortBusy, PortLock, lock_port

__all__ = ["PortClaim", "claim_port"]

# Free ports tried for --port 0 before giving up (each lost only to another tandem server taking the same one).
_FREE_PORT_TRIES = 16
# granian's workers bind with SO_REUSEPORT on Linux, so a socket bound the same way keeps the chosen port from
# anyone else until the server stops; bound, never listening, it is handed no connection.
_RESERVE = sys.platform == "linux" and hasattr(socket, "SO_REUSEPORT")


@dataclass
class PortClaim:
    """A claimed port: its lock (held while the server serves) and the address `host` resolved to."""

    lock: PortLock
    address: str
    port: int  # the port to serve on: the one asked for, or the one chosen for --port 0
    reservation: socket.socket | None = None  # --port 0 on Linux: holds the chosen port for this server

    def release(self) -> None:
        """Let the port go. Idempotent. Raises nothing."""
        self.lock.release()
        if self.reservation is not None:
            self.reservation.close()
            self.reservation = None


def claim_port(host: str, port: int) -> PortClaim:
    """Take `port`'s lock, then check it binds on `host` (port 0: choose a free one first). Raises CLIError when
    another tandem server holds the lock or host:port cannot be resolved or bound."""
    if port == 0:
        return _claim_free_port(host)
    try:
        # granian binds with SO_REUSEPORT: a bind check alone lets a server starting beside this one share the port.
        lock = lock_port(port)
    except PortBusy:
        raise CLIError(f"cannot listen on {host}:{port}: Address already in use (is another server running?)") from None
    try:
        address = _check_port(host, port)
    except BaseException:
        lock.release()
        raise
    return PortClaim(lock, address, port)


def _resolve(host: str, port: int) -> tuple[Any, ...]:
    """getaddrinfo's first answer for host:port. Raises CLIError when the name does not resolve."""
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError as exc:
        raise CLIError(f"cannot resolve --host {host!r}: {exc}") from None


def _check_port(host: str, port: int) -> str:
    """The IP address `host` (a name or an address) resolves to, once a socket binds there. Raises CLIError when
    host:port cannot be resolved or bound (granian would fail later with a Rust backtrace)."""
    family, kind, proto, _, address = _resolve(host, port)
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise CLIError(f"cannot listen on {host}:{port}: {exc.strerror or exc} "
                           "(is another server running?)") from None
    return str(address[0])


def _claim_free_port(host: str) -> PortClaim:
    """A port the kernel hands out as free on `host`, its lock taken and (Linux) reserved. Raises CLIError when
    nothing binds on `host`."""
    family, kind, proto, _, address = _resolve(host, 0)
    for _ in range(_FREE_PORT_TRIES):
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.bind(address)
            except OSError as exc:
                raise CLIError(f"cannot listen on {host}: {exc.strerror or exc}") from None
            port = int(probe.getsockname()[1])
        try:
            lock = lock_port(port)
        except PortBusy:
            continue  # another tandem server is starting on it
        try:
            reservation = _reserve(family, kind, proto, (address[0], port, *address[2:]))
        except OSError:
            lock.release()  # taken between the probe and now: another one
            continue
        return PortClaim(lock, str(address[0]), port, reservation)
    raise CLIError(f"cannot listen on {host}: no free port found in {_FREE_PORT_TRIES} tries")


def _reserve(family: int, kind: int, proto: int, address: tuple[Any, ...]) -> socket.socket | None:
    """A socket bound to `address` as granian's workers bind (so they bind beside it), or None where that is not
    how granian binds. Raises OSError when the port is taken."""
    if not _RESERVE:
        return None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock
