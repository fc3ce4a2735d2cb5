"""What tandem itself wrote under ~/.cache/mlx-tandem, as `tandem models ls` lists it and `tandem models rm`
removes it: GGUF conversions (`gguf/<name>-<key>[-f32]`), Whisper imports (`whisper/<key>/<name>-<dtype>`, older
ones `whisper/<name>`) and what interrupted ones left (staging folders, `.tmp*` files). Never the Hugging Face
cache, the demo's package files or a folder the user named: tandem did not make them."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from service.cli.errors import CLIError

__all__ = ["CacheEntry", "Leftover", "cache_entries", "leftovers", "no_server_loading", "remove_entry",
           "remove_leftover"]


@dataclass(frozen=True)
class CacheEntry:
    """A model tandem converted or imported into its cache."""

    name: str  # as `models ls` shows it (before its note) and `models rm` takes it
    kind: str  # "llm" or "whisper"
    path: Path
    size_bytes: int
    note: str  # "converted", "imported", "old import"
    source: str | None  # the file or folder it was made from (source.json); None when unrecorded


@dataclass(frozen=True)
class Leftover:
    """What an interrupted conversion or import left: a staging folder or a temporary file."""

    path: Path
    size_bytes: int


def _root() -> Path:
    from engine.backend import user_cache_dir  # no mlx import

    return user_cache_dir()


def cache_entries(root: Path | None = None) -> list[CacheEntry]:
    """The GGUF conversions (by name) and the Whisper imports (as audio.whisper lists them). Raises nothing."""
    from engine.cache_entries import read_source

    root = root if root is not None else _root()
    found: list[CacheEntry] = []
    for entry in _children(root / "gguf"):
        if entry.is_dir() and not entry.name.startswith("."):  # `.convert-*`: staging, a leftover
            recorded = read_source(entry)
            found.append(CacheEntry(entry.name, "llm", entry, _size(entry), "converted",
                                    recorded.path if recorded is not None else None))
    from audio.whisper_imports import keyed_imports, unkeyed_imports

    whisper = root / "whisper"
    for path, note in [*((p, "imported") for p in keyed_imports(whisper)),
                       *((p, "old import") for p in unkeyed_imports(whisper))]:
        recorded = read_source(path)
        found.append(CacheEntry(path.name, "whisper", path, _size(path), note,
                                recorded.path if recorded is not None else None))
    return found


def leftovers(root: Path | None = None) -> list[Leftover]:
    """Staging folders of interrupted conversions and imports (`gguf/.convert-*`, `whisper/*.partial`), and temporary
    files (`.tmp*`, `*.tmp`) a write cut short left in an entry (safetensors writes through one). Raises nothing."""
    root = root if root is not None else _root()
    staging = [p for p in [*_children(root / "gguf", ".convert-*"), *_children(root / "whisper", "*.partial")]
               if p.is_dir()]
    found = [Leftover(p, _size(p, whole=True)) for p in staging]
    for base in (root / "gguf", root / "whisper"):
        for path in sorted({*_walk(base, ".tmp*"), *_walk(base, "*.tmp")}):
            if path.is_file() and not any(s in path.parents for s in staging):
                found.append(Leftover(path, _file_size(path)))
    return found


@contextlib.contextmanager
def no_server_loading(root: Path | None = None) -> Iterator[None]:
    """Hold the conversions lock exclusively (servers hold it shared while they load and convert), so nothing
    removed here is being written. Raises CLIError (exit 1) while a server is loading models."""
    from service.process.cleanup import LOCK_NAME

    root = root if root is not None else _root()
    try:
        fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # no cache folder (nothing to remove) or an unwritable one: the removal says which
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CLIError("a server is loading models now (it may be converting one): run this again once it is "
                           "ready", code=1) from None
        yield
    finally:
        os.close(fd)  # closing releases the lock


def remove_entry(entry: CacheEntry, root: Path | None = None) -> None:
    """Remove `entry`: first moved into a staging folder the start-up cleanup removes, so a removal cut short never
    leaves half a model under its name; then deleted. Raises OSError when it cannot be moved."""
    root = root if root is not None else _root()
    if entry.kind == "llm":
        staging = Path(tempfile.mkdtemp(dir=root / "gguf", prefix=".convert-"))
    else:
        staging = Path(tempfile.mkdtemp(dir=root / "whisper", prefix=".removed-", suffix=".partial"))
    try:
        entry.path.rename(staging / entry.path.name)
    except OSError:
        staging.rmdir()
        raise
    shutil.rmtree(staging, ignore_errors=True)
    if entry.kind == "whisper" and entry.path.parent != root / "whisper":
        with contextlib.suppress(OSError):
            entry.path.parent.rmdir()  # its key folder, once empty (another dtype's import of it stays)


def remove_leftover(leftover: Leftover) -> None:
    """Delete a staging folder or temporary file. Raises OSError."""
    if leftover.path.is_dir():
        shutil.rmtree(leftover.path)
    else:
        leftover.path.unlink()


def _children(folder: Path, pattern: str = "*") -> list[Path]:
    try:
        return sorted(folder.glob(pattern))
    except OSError:
        return []


def _walk(folder: Path, pattern: str) -> list[Path]:
    try:
        return list(folder.rglob(pattern))
    except OSError:
        return []


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _size(folder: Path, *, whole: bool = False) -> int:
    """The folder's files, less the temporary ones `leftovers` lists apart (they were counted twice) unless `whole`
    (a staging folder, listed whole). Raises nothing."""
    from engine.cache_entries import cut_short_write

    return sum(_file_size(f) for f in _walk(folder, "*") if f.is_file() and (whole or not cut_short_write(f)))
