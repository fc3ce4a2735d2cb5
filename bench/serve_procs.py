"""Server processes for the serving benchmark: start from a command, wait until ready, sample RSS, stop.

A server is started in its own session (setsid), so every process it spawns (granian's worker) carries
the server's pid as session id: RSS is summed over that session and the server's descendants, read from
/proc (no psutil), and only those processes are signalled at stop.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any

import httpx

__all__ = ["Server", "exit_on_sigterm", "session_pids", "session_rss", "kill_in_session"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def session_pids(sid: int) -> list[int]:
    """`sid` and the pids whose session id is `sid` or that descend from it (from /proc/PID/stat; the parent
    links cover sandboxes that leave the session field empty). Raises nothing."""
    parents: dict[int, int] = {}
    members = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised name: state ppid pgrp session ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) < 4:
            continue
        pid = int(entry)
        parents[pid] = int(fields[1])
        if pid == sid or int(fields[3]) == sid:
            members.add(pid)
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in members and pid not in members:
                members.add(pid)
                grew = True
    return sorted(members)


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (stat field 22), or None when it is gone. Raises nothing."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rfind(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        pass
    try:  # some kernels (or sandboxes) fill only /proc/PID/status
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def kill_in_session(sid: int, marker: str) -> int | None:
    """SIGKILL the first process of `sid`'s session whose command line contains `marker` (a fault to inject,
    e.g. the engine process of an --isolate server); its pid, or None when there is none. Raises nothing."""
    for pid in session_pids(sid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            return pid
    return None


def session_rss(sid: int) -> int:
    """Resident bytes summed over the session's processes (shared pages counted per process). Raises nothing."""
    return sum(_rss(pid) for pid in session_pids(sid))


def _answers(base_url: str) -> bool:
    """Whether a TCP connection to base_url's host and port is accepted. Raises nothing."""
    url = httpx.URL(base_url)
    try:
        with socket.create_connection((url.host, url.port or 80), timeout=1.0):
            return True
    except OSError:
        return False


def exit_on_sigterm(signum: int, frame: Any) -> None:
    """A SIGTERM handler (`timeout` sends one): unwind through the `finally`s, so the servers, each in a session of
    its own that the signal does not reach, are stopped too. Raises SystemExit."""
    raise SystemExit(128 + signum)


class Server:
    """One server under test: `start()`, `wait_ready()`, RSS samples while it runs, `stop()`."""

    def __init__(self, name: str, argv: list[str], base_url: str, log_path: Path, env: dict[str, str] | None = None,
                 rss_interval: float = 0.5) -> None:
        self.name, self.argv, self.base_url, self.log_path, self.env = name, argv, base_url, log_path, env
        self.rss_interval = rss_interval
        self.samples: list[tuple[float, int]] = []  # (perf_counter, bytes)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    def start(self) -> None:
        """Spawn the server (stdout+stderr into the log file). Raises OSError when it cannot be spawned, and
        RuntimeError when something already answers at base_url: a server left over from an earlier run would
        pass wait_ready and be measured in place of this one."""
        if _answers(self.base_url):
            raise RuntimeError(f"{self.name}: something already listens at {self.base_url} (a leftover server?)")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        self._log.write(("$ " + " ".join(self.argv) + "\n").encode())
        self._log.flush()
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        self._sampler = threading.Thread(target=self._sample, name=f"rss-{self.name}", daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        assert self.proc is not None
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), session_rss(self.proc.pid)))
            self._stop.wait(self.rss_interval)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, path: str, timeout: float) -> float:
        """Poll GET base_url+path until 200; return the seconds it took.

        Raises RuntimeError when the process exits first, TimeoutError after `timeout` seconds.
        """
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode if self.proc else '?'} before ready "
                                   f"(log: {self.log_path})")
            try:
                if httpx.get(self.base_url + path, timeout=2).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.25)  # polling another process's start-up, nothing of ours to wait on
        raise TimeoutError(f"{self.name} not ready at {self.base_url}{path} after {timeout:.0f} s (log: {self.log_path})")

    def rss_between(self, t0: float, t1: float) -> int:
        """Peak sampled RSS in [t0, t1] (bytes; 0 when no sample fell inside). Raises nothing."""
        return max((b for t, b in self.samples if t0 <= t <= t1), default=0)

    def rss_now(self) -> int:
        """RSS right now (bytes). Raises nothing."""
        return session_rss(self.proc.pid) if self.proc else 0

    def stop(self, grace: float = 20.0) -> int | None:
        """SIGTERM the server, SIGKILL what is left of its session after `grace` s. Returns its exit code.

        Raises nothing.
        """
        self._stop.set()
        if self.proc is None:
            return None
        sid = self.proc.pid
        before = {pid: _start_time(pid) for pid in session_pids(sid) if pid != sid}
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        # Children of ours that outlived the server (its session or descendants, checked by start time).
        left = {pid: _start_time(pid) for pid in session_pids(sid) if pid != sid}
        for pid, started in (before | left).items():
            if started is not None and _start_time(pid) == started:  # the same process, not a reused pid
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        if self._sampler is not None:
            self._sampler.join(timeout=5)
        if self._log is not None:
            self._log.close()
        return self.proc.returncode
