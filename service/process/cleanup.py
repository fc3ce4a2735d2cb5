"""What an interrupted first start leaves behind: GGUF conversions (`gguf/.convert-*`) and Whisper imports
(`whisper/*.partial`) under ~/.cache/mlx-tandem, removed at the next start.

A conversion in progress must not be removed: servers hold a shared lock on `<cache>/.conversions.lock`
while they load models (conversions happen during the load), and the cleanup runs only when it can take
the lock exclusively, i.e. when no server is loading. The kernel drops the lock of a killed process.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
from pathlib import Path
from typing import Iterator

__all__ = ["loading_models", "remove_interrupted_conversions", "LOCK_NAME"]

LOCK_NAME = ".conversions.lock"

_log = logging.getLogger("tandem.service")


def _root(root: Path | None) -> Path:
    from engine.backend import user_cache_dir  # the cache root is the engine's (no mlx import)

    return root if root is not None else user_cache_dir()


def _lock_file(root: Path) -> int:
    root.mkdir(parents=True, exist_ok=True)
    return os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)


@contextlib.contextmanager
def loading_models(root: Path | None = None) -> Iterator[None]:
    """Hold the shared lock while models load (and may convert). Raises nothing (without a writable cache
    the load goes on unlocked)."""
    try:
        fd = _lock_file(_root(root))
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def remove_interrupted_conversions(root: Path | None = None) -> list[Path]:
    """Remove staging folders of conversions no server is running; returns what was removed. Skips it all
    when some server is loading models now. Raises nothing."""
    root = _root(root)
    staging = [*sorted((root / "gguf").glob(".convert-*")), *sorted((root / "whisper").glob("*.partial"))]
    if not staging:
        return []
    try:
        fd = _lock_file(root)
    except OSError:
        return []
    removed: list[Path] = []
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log.info("another server is loading models; interrupted conversions are left for a later start")
            return []
        for folder in staging:
            if folder.is_dir():
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
                _log.info("removed %s (a conversion interrupted by an earlier start)", folder)
    finally:
        os.close(fd)
    return removed
