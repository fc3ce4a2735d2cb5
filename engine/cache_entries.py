"""What a cache entry (a GGUF conversion, a Whisper import) was made from, and removing the entries a new one
supersedes, so reinstalls and upgrades do not leave a copy of the same model behind each time.

Each entry holds `source.json`: the source's resolved path, the key the entry is named by and the writer's format
version. When an entry is written, those it supersedes go: recorded for the same source path with another key (the
file changed in place, or an older format version read it), or recorded for a path that no longer exists (the venv
or clone that held it is gone). An entry whose source still exists elsewhere (two installs side by side), one a
newer version wrote, and one without `source.json` (written before it existed: its source is unknown) stay.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from shutil import rmtree
from typing import Any, Iterable

__all__ = ["SIDECAR", "EntrySource", "cut_short_write", "prune_superseded", "read_source", "record_source"]

SIDECAR = "source.json"

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EntrySource:
    """The source of one cache entry, as its sidecar records it."""

    path: str  # the source's resolved path
    key: str  # the hash the entry is named by
    version: tuple[int, ...]  # the writer's format version(s)
    hashed: dict[str, Any] = field(default_factory=dict)  # what else the key hashed (sizes, mtimes), for people


def record_source(entry: Path, source: EntrySource) -> None:
    """Write `entry`/source.json (through a rename: a reader never sees half of it). Raises OSError."""
    tmp = entry / f".{SIDECAR}.tmp"
    tmp.write_text(json.dumps(asdict(source), indent=2))
    tmp.replace(entry / SIDECAR)


def read_source(entry: Path) -> EntrySource | None:
    """The source `entry`'s sidecar records; None without a readable one. Raises nothing."""
    try:
        data = json.loads((entry / SIDECAR).read_text())
        return EntrySource(str(data["path"]), str(data["key"]), tuple(int(v) for v in data["version"]),
                           dict(data.get("hashed") or {}))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _gone(path: Path) -> bool:
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False  # unreadable (a permission) is not gone: its entry stays
    return False


def _superseded(recorded: EntrySource, written: EntrySource) -> bool:
    if _gone(Path(recorded.path)):
        return True  # its source is gone: nothing can ask for this entry again
    # The same file read again: changed in place, or read by an older format (a newer install's entry is its own).
    return recorded.path == written.path and recorded.key != written.key and recorded.version <= written.version


def prune_superseded(candidates: Iterable[Path], written: Path, source: EntrySource, *, staging_root: Path,
                     staging_prefix: str, staging_suffix: str = "") -> list[Path]:
    """Remove the `candidates` that the entry `written` (from `source`) supersedes; returns those removed. Each is
    first moved into a staging folder under `staging_root`, named as the start-up cleanup's (prefix, suffix), so a
    removal cut short never leaves half an entry under its key and the next start finishes it. Raises nothing: a
    removal that fails is logged and left."""
    removed: list[Path] = []
    for entry in candidates:
        if entry == written:
            continue
        recorded = read_source(entry)
        if recorded is None or not _superseded(recorded, source):
            continue
        try:
            staging = Path(tempfile.mkdtemp(dir=staging_root, prefix=staging_prefix, suffix=staging_suffix))
        except OSError as exc:
            _log.warning("could not remove %s (superseded by %s): %s", entry, written, exc)
            continue
        try:
            entry.rename(staging / entry.name)
        except OSError as exc:
            _log.warning("could not remove %s (superseded by %s): %s", entry, written, exc)
            with contextlib.suppress(OSError):
                staging.rmdir()
            continue
        removed.append(entry)
        _log.info("removed %s (made from %s, superseded by %s)", entry, recorded.path, written)
        try:
            rmtree(staging)
        except OSError as exc:
            _log.warning("could not remove all of %s (the next start retries): %s", staging, exc)
    return removed


def cut_short_write(path: Path) -> bool:
    """Whether `path` is a temporary file a write cut short left in an entry (`.tmp*`, `*.tmp`: safetensors writes
    through one): not the entry's, listed apart by `tandem models ls`. Raises nothing."""
    return path.name.startswith(".tmp") or path.name.endswith(".tmp")
