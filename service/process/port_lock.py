"""One server per port: an exclusive lock on `<runtime dir>/ports/<port>.lock`, held for the server's life.

granian binds its socket with SO_REUSEPORT, so a second server on a busy port binds too and the kernel
splits clients between the two; a test bind before granian starts cannot see a server that has not bound
yet. The lock is taken before that check, so of two servers started together the second is refused. It is
per port, not per address: 0.0.0.0:P and 127.0.0.1:P share loopback clients the same way. The kernel drops
the lock of a killed process, so nothing stale is ever left behind.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = ["PortLock", "PortBusy", "lock_port", "ports_dir"]


class PortBusy(OSError):
    """Another tandem server holds the port's lock."""


class PortLock:
    """A held port lock; `release()` (or process exit) lets the port go. Raises nothing."""

    def __init__(self, fd: int | None, path: Path | None) -> None:
        self.fd = fd
        self.path = path

    def release(self) -> None:
        """Drop the lock. Idempotent. Raises nothing."""
        if self.fd is not None:
            os.close(self.fd)  # closing releases the flock
            self.fd = None


def ports_dir() -> Path:
    """Where port locks live: `$XDG_RUNTIME_DIR/mlx-tandem/ports` (per user, cleared at logout), else the
    user's cache root. Raises nothing."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "mlx-tandem" / "ports"
    from engine.backend import user_cache_dir  # no mlx import

    return user_cache_dir() / "ports"


def lock_port(port: int, root: Path | None = None) -> PortLock:
    """Take the exclusive lock of `port` without waiting. Raises PortBusy when another process holds it;
    without a writable lock directory returns an unheld lock (the bind check still runs)."""
    folder = root if root is not None else ports_dir()
    path = folder / f"{port}.lock"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # O_CLOEXEC (Python's default): the spawned worker must not inherit, and so outlive, the lock.
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return PortLock(None, None)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise PortBusy(f"port {port} is held by another tandem server ({path})") from None
    except OSError:  # a file system without flock: fall back on the bind check alone
        os.close(fd)
        return PortLock(None, None)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())  # for a person looking: which process holds it
    return PortLock(fd, path)
