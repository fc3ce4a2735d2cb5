"""CTranslate2 Whisper imports in the user cache: keyed by the source's identity, named for people.

Layout: `<cache>/whisper/<key>/<name>-<dtype>`, the key a hash of the source folder's resolved path and its
model.bin's and config.json's size and mtime (as engine/gguf.py keys its conversions) and of the importer's
versions, so another checkpoint in a folder of the same name, one changed in place, or one an older importer read
differently, gets an import of its own. Each leaf records its source (`source.json`, engine/cache_entries.py), and
writing one removes the imports it supersedes: of the same folder changed in place or read by an older importer,
or of a folder that is gone (a reinstall, an upgrade, a deleted venv). The leaf keeps a friendly name: a
checkpoint given by path is served under its folder's name. Each import is written in a staging folder of its own,
`<cache>/whisper/<key>-<name>-<dtype>.<random>.partial`, where the start-up cleanup looks for interrupted ones, so
two processes importing one source at once never write into each other's files: the first rename wins.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from audio.errors import WhisperUnreadableError
from engine.cache_entries import EntrySource, prune_superseded, read_source, record_source

__all__ = ["is_whisper_checkpoint", "source_key", "display_name", "import_name", "cached_import", "keyed_imports",
           "unkeyed_imports"]

# Bump when the written layout changes, so older imports are never reused (the importer's FORMAT_VERSION, for
# what the weights hold, is in the key as well).
_IMPORT_VERSION = 1
# Folder names that say nothing about the checkpoint: the parent folder names it instead.
_GENERIC_NAMES = frozenset({"model", "models"})
_KEY_CHARS = 16

_log = logging.getLogger(__name__)


def is_whisper_checkpoint(path: str | Path) -> bool:
    """config.json with Whisper's ModelDimensions plus weights.safetensors/npz. Raises nothing."""
    p = Path(path)
    try:
        config = json.loads((p / "config.json").read_text())
    except (OSError, ValueError):
        return False
    has_weights = (p / "weights.safetensors").is_file() or (p / "weights.npz").is_file()
    return has_weights and isinstance(config, dict) and {"n_mels", "n_audio_ctx", "n_text_ctx"} <= config.keys()


def source_key(ct2_dir: Path) -> str:
    """A hex key for a CTranslate2 folder: its resolved path plus the size and mtime of the files an import reads
    (stat follows an HF cache snapshot's links to their blobs). Raises nothing."""
    return _source(ct2_dir).key


def _source(ct2_dir: Path) -> EntrySource:
    """What source_key hashes, and the key, as an import's sidecar records them. Raises nothing."""
    from audio import ctranslate2_import

    source = ct2_dir.resolve()
    parts = [str(source)]
    for file in ("model.bin", "config.json"):
        try:
            stat = (source / file).stat()
            parts.append(f"{stat.st_size}:{stat.st_mtime_ns}")
        except OSError:
            parts.append("-")
    parts.append(f"{_IMPORT_VERSION}.{ctranslate2_import.FORMAT_VERSION}")
    key = hashlib.sha256("|".join(parts).encode()).hexdigest()[:_KEY_CHARS]
    return EntrySource(str(source), key, (_IMPORT_VERSION, ctranslate2_import.FORMAT_VERSION),
                       {"model.bin": parts[1], "config.json": parts[2]})


def display_name(ct2_dir: Path) -> str:
    """The name an import of `ct2_dir` goes by: the repo's name for an HF cache snapshot (its folder is a commit
    hash), the parent folder's for a folder named `model`, else the folder's own. Raises nothing."""
    from engine.hub import cached_repo_id

    source = ct2_dir.resolve()
    if source.parent.name == "snapshots" and (repo := cached_repo_id(source.parent.parent)) is not None:
        return repo.rsplit("/", 1)[-1]
    if source.name in _GENERIC_NAMES and source.parent.name:
        return source.parent.name
    return source.name


def import_name(imported: Path, dtype: str) -> str:
    """The name the `dtype` import at `imported` (`<key>/<name>-<dtype>`) goes by: what cached_import was given,
    the source's display_name or the demo's. Raises nothing."""
    return imported.name.removesuffix(f"-{dtype}")


def cached_import(ct2_dir: Path, name: str, dtype: str, root: Path) -> Path:
    """The mlx-whisper import of `ct2_dir` under `root`, importing it on first use of this source. Raises
    CheckpointFormatError for a model.bin that is no Whisper, WhisperUnreadableError for an import there whose
    config.json this process cannot read, OSError when the cache cannot be written."""
    from audio.ctranslate2_import import import_ct2_whisper
    made_from = _source(ct2_dir)
    key = made_from.key
    out = root / key / f"{name}-{dtype}"
    if is_whisper_checkpoint(out):
        if read_source(out) is None:
            # Written before sidecars: the key, a hash of this very folder and its files' stats, says it made it.
            with contextlib.suppress(OSError):
                record_source(out, made_from)
        return out
    try:
        if (out / "config.json").exists():
            os.close(os.open(out / "config.json", os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)))
    except OSError as exc:  # another user's import, not this process's to read: named, not imported again over it
        raise WhisperUnreadableError(f"{type(exc).__name__}: {exc}") from None
    root.mkdir(parents=True, exist_ok=True)
    # A staging folder of this call's own (two servers starting at once each import), moved under the key in one
    # rename; `*.partial`, where the start-up cleanup looks for those of a killed process.
    staging = Path(tempfile.mkdtemp(dir=root, prefix=f"{key}-{out.name}.", suffix=".partial"))
    try:
        staged = staging / out.name
        _log.info("first use of Whisper %s (%s): importing its CTranslate2 weights (%s) into %s (once)", name,
                  ct2_dir, dtype, out)
        import_ct2_whisper(ct2_dir, staged, dtype=dtype)
        record_source(staged, made_from)
        _move_in(staged, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _prune(root, out, made_from)
    return out


def _move_in(staged: Path, out: Path) -> None:
    """Rename the whole import `staged` to `out`; another process's import already there is kept (it is as good).
    Raises OSError when neither lands."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists() and not is_whisper_checkpoint(out):
        shutil.rmtree(out, ignore_errors=True)  # an unreadable leftover: it would block the rename
    try:
        staged.rename(out)
    except OSError:
        if not is_whisper_checkpoint(out):  # else another process imported the same source first
            raise


def _prune(root: Path, written: Path, made_from: EntrySource) -> None:
    """Remove the imports `written` supersedes (engine/cache_entries.py), and the key folders left empty. Raises
    nothing."""
    try:
        leaves = [leaf for key in _key_dirs(root) for leaf in _children(key)]
    except OSError:
        return
    # Staged as `*.partial`, which the start-up cleanup removes when a removal is cut short.
    for leaf in prune_superseded(leaves, written, made_from, staging_root=root, staging_prefix=".superseded-",
                                 staging_suffix=".partial"):
        with contextlib.suppress(OSError):
            leaf.parent.rmdir()  # only when empty: another dtype's import of that source stays


def _key_dirs(root: Path) -> list[Path]:
    """The key folders under `root`: not an unkeyed import, nor a staging folder (`*.partial`). Raises OSError."""
    return [key for key in root.iterdir()
            if key.is_dir() and not key.name.endswith(".partial") and not is_whisper_checkpoint(key)]


def _children(folder: Path) -> list[Path]:
    try:
        return [leaf for leaf in folder.iterdir() if leaf.is_dir()]
    except OSError:
        return []


def keyed_imports(root: Path) -> list[Path]:
    """Imports under `root` (`<key>/<name>-<dtype>`), by name, the newest first among those of one name (a
    lookup by name takes the first). Raises nothing."""
    try:
        found = [leaf for key in _key_dirs(root) for leaf in key.iterdir() if is_whisper_checkpoint(leaf)]
        return sorted(found, key=lambda p: (p.name, -p.stat().st_mtime_ns, str(p)))
    except OSError:
        return []


def unkeyed_imports(root: Path) -> list[Path]:
    """Checkpoints directly in `root`: imports by older versions (keyed by folder name only, so never reused) or
    one whose move under its key an older version cut short. Raises nothing."""
    try:
        return sorted(p for p in root.iterdir() if is_whisper_checkpoint(p))
    except OSError:
        return []
