"""OpenBLAS's thread count follows chat: all cores but one while chat rows run, every core while none does.

On a CPU MLX's products run on OpenBLAS, whose thread count holds for the whole process. One core is kept for
the event loop while chat streams: on 2 cores a second BLAS thread made a chat stream's p99 token gap beside 4
live sessions 7.1x its gap alone, against 1.2x with one. With no chat row, live speech is all that computes,
and the second thread let 8 speakers keep up on 2 cores (done 2.9 s after their last chunk, against 5.5 s).
Only the default count changes: a user's OPENBLAS_NUM_THREADS stands, and nothing changes without our OpenBLAS.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

from engine import backend

__all__ = ["follow_chat", "threads_now"]

_lock = threading.Lock()
_current: int | None = None  # the count last set here (None: OpenBLAS's own from the environment)


def follow_chat(chat_running: bool) -> None:
    """Set OpenBLAS's threads for whether chat rows run now (engine/driver.py, when that changes; a product already
    running keeps its count). Raises nothing."""
    global _current
    setter = _openblas("openblas_set_num_threads")
    if setter is None or os.environ.get(backend.DEFAULTED_THREADS) != "1":
        return
    want = backend.default_threads() if chat_running else backend.cores()
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
