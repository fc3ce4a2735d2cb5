"""Progress bars for the long one-off steps of a first start (GGUF → float32, Whisper imports): tqdm on
stderr when it is a terminal, nothing otherwise (logs and tests stay clean)."""

from __future__ import annotations

import sys
import threading
from typing import Iterable, Iterator, TypeVar

__all__ = ["progress"]

T = TypeVar("T")


def progress(items: Iterable[T], description: str, *, total: int | None = None, unit: str = "tensor") -> Iterator[T]:
    """`items`, with a progress bar while they are consumed. Raises nothing of its own."""
    from tqdm import tqdm

    if not hasattr(tqdm, "_lock"):
        # tqdm's default lock holds a multiprocessing semaphore, which a process ending with os._exit (a Ctrl-C during
        # a conversion) left to the resource tracker's "leaked semaphore" warning; these bars are one process's.
        tqdm.set_lock(threading.RLock())
    yield from tqdm(items, desc=description, total=total, unit=unit, file=sys.stderr, leave=False, disable=None)
