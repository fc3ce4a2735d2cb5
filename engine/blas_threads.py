"""OpenBLAS's thread count follows the machine: every core while this process has it to itself, all but one while it
shares it.

On a CPU MLX's products run on OpenBLAS, whose thread count holds for the whole process (a pthreads build: one
global count, so it may be set from any thread; a product already running keeps its count). One core is kept for
the event loop while chat streams beside other work: on 2 cores a second BLAS thread made a chat stream's p99 token
gap beside 4 live sessions 7.1x its gap alone, against 1.2x with one, and beside one other busy process decode fell
to a tenth (OpenBLAS's threads wait on each other whenever one is descheduled). With chat alone on a quiet machine
the second thread served 8 streams 35 % faster. So chat gets every core only while its products are wider than GEMVs, no Whisper window ran for 5 s
and the rest of the machine used under a fifth of a core over the last second (`OtherLoad`, from /proc; elsewhere
never). Whisper's products wait the same way beside a busy process (one live speaker's first words 7.7 s after
onset with two threads, 1.0 s with one, another process using a core of 2), so speech, with or without chat, gets
every core only while the rest of the machine is quiet: then every core let 8 speakers keep up on 2 cores.
Only the default count changes: a user's OPENBLAS_NUM_THREADS stands, and nothing changes without our OpenBLAS.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Any, Callable

from engine import backend

__all__ = ["OtherLoad", "follow_chat", "follow_speech", "recheck", "threads_now"]

SPEECH_HOLD_S = 5.0  # speech counts as computing this long after its last window (the next is often a second away)


class OtherLoad:
    """The CPU the rest of the machine uses, in cores: /proc/stat's busy time less this process's own, over the last
    `interval` seconds. `quiet` stays False where /proc cannot be read. Raises nothing."""

    def __init__(self, interval: float = 1.0, quiet_below: float = 0.2,
                 machine: Callable[[], float | None] | None = None, own: Callable[[], float] | None = None) -> None:
        self.interval = interval
        self.quiet_below = quiet_below
        self._machine = machine or _machine_busy_seconds
        self._own = own or (lambda: sum(os.times()[:2]))
        self._last: tuple[float, float, float] | None = None  # (monotonic, machine busy s, own s)
        self.quiet = False
        self.cores: float | None = None  # the last sample

    def sample(self, now: float) -> bool:
        """Take a sample when `interval` has passed since the last; returns whether `quiet` changed."""
        if self._last is not None and now - self._last[0] < self.interval:
            return False
        busy = self._machine()
        if busy is None:
            return False
        last, self._last = self._last, (now, busy, self._own())
        if last is None:
            return False
        self.cores = max(0.0, (busy - last[1]) - (self._last[2] - last[2])) / max(now - last[0], 1e-6)
        was, self.quiet = self.quiet, self.cores < self.quiet_below
        return was != self.quiet


def _machine_busy_seconds() -> float | None:
    """Seconds every core has spent busy since boot (/proc/stat), or None. Raises nothing."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
        return (user + nice + system + irq + softirq + steal) / _TICKS
    except (OSError, ValueError):
        return None


_TICKS = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
_lock = threading.Lock()
_current: int | None = None  # the count last set here (None: OpenBLAS's own from the environment)
_chat = False
_wide = False  # chat's products have more rows than the GEMV shim takes (a prompt, or > GEMV_ROWS rows decoding)
_speech = False
_speech_ended = -1e9  # monotonic time speech's last window ended
_next_check = 0.0  # when `recheck` next samples and applies
others = OtherLoad()


def follow_chat(chat_running: bool, wide: bool = True) -> None:
    """Set OpenBLAS's threads for whether chat rows run now (engine/driver.py, when that changes; a product already
    running keeps its count). `wide`: its products have more rows than GEMVs take (a prompt, or > GEMV_ROWS rows
    decoding); narrower ones gain nothing from a second thread (one stream's token gap p50 55-56 against 57-59 ms)
    and their tail grows (p90 71-77 against 67-68 ms, p99 alone 97 against 66 ms). Raises nothing."""
    global _chat, _wide
    _chat, _wide = chat_running, wide
    _apply()


def follow_speech(computing: bool) -> None:
    """Whisper windows are in flight (True) or none is left (False; speech still counts for SPEECH_HOLD_S); while
    they are, `recheck` samples the machine's other load too (audio/scheduler.py, before each step). Raises nothing."""
    global _speech, _speech_ended
    if not computing and _speech:
        _speech_ended = time.monotonic()
    _speech = computing
    _apply()


def recheck() -> None:
    """While chat or speech computes (engine/driver.py each iteration, audio/scheduler.py before each Whisper step):
    sample the machine's other load at most once a second and apply what changed (the speech hold's end too),
    nothing more per call than a clock read. Raises nothing."""
    global _next_check
    now = time.monotonic()
    if (_chat or _speech) and now >= _next_check:
        _next_check = now + others.interval
        others.sample(now)
        _apply()


def _apply() -> None:
    global _current
    setter = _openblas("openblas_set_num_threads")
    if setter is None or os.environ.get(backend.DEFAULTED_THREADS) != "1":
        return
    speech = _speech or time.monotonic() - _speech_ended < SPEECH_HOLD_S
    # Speech alone shares too while another process is busy: its threads wait on each other there as chat's do.
    shared = (_chat and (speech or not _wide)) or ((_chat or speech) and not others.quiet)
    want = backend.default_threads() if shared else backend.cores()
    with _lock:
        if want != _current:
            setter(ctypes.c_int(want))
            _current = want


def threads_now() -> int | None:
    """OpenBLAS's thread count now, or None without our OpenBLAS. Raises nothing."""
    getter = _openblas("openblas_get_num_threads")
    return int(getter()) if getter is not None else None


def _openblas(symbol: str) -> Any:
    handle = backend._handle
    return getattr(handle, symbol, None) if handle is not None else None
