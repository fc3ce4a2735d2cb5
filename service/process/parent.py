"""A child process that dies with its parent, so a `kill -9` of the supervisor never leaves a worker
holding the port and serving on its own.

Linux: prctl(PR_SET_PDEATHSIG, SIGKILL), then a check that the parent did not die before that call.
Elsewhere: a daemon thread that exits the process once the parent pid changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import threading

__all__ = ["exit_with_parent", "PARENT_PID_ENV"]

# The supervisor's pid, set before it spawns children: a child whose parent is already gone exits.
PARENT_PID_ENV = "TANDEM_SUPERVISOR_PID"

_PR_SET_PDEATHSIG = 1
_POLL_SECONDS = 1.0

_log = logging.getLogger("tandem.service")


def exit_with_parent(expected_parent: int | None = None) -> str:
    """Bind this process's life to its parent's. `expected_parent` (default: PARENT_PID_ENV, else the
    current parent) is checked after binding: if the parent already changed, the process exits at once.
    Returns how it is bound ("pdeathsig" or "watch"). Raises nothing."""
    if expected_parent is None:
        raw = os.environ.get(PARENT_PID_ENV, "")
        expected_parent = int(raw) if raw.isdigit() else os.getppid()
    how = "watch"
    if sys.platform.startswith("linux") and _set_pdeathsig(signal.SIGKILL):
        how = "pdeathsig"
    else:
        threading.Thread(target=_watch_parent, args=(expected_parent,), name="parent-watch", daemon=True).start()
    if os.getppid() != expected_parent:  # the parent died before the binding took effect
        _log.error("supervisor (pid %d) is gone; exiting", expected_parent)
        os._exit(1)
    return how


def _set_pdeathsig(sig: int) -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    stop = threading.Event()
    while os.getppid() == parent:
        stop.wait(_POLL_SECONDS)  # polling another process's life: there is nothing of ours to wait on
    _log.error("supervisor (pid %d) is gone; exiting", parent)
    os._exit(1)
