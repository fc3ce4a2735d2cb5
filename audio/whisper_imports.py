"""CTranslate2 Whisper imports in the user cache: keyed by the source's identity, named for people.

Layout: `<cache>/whisper/<key>/<name>-<dtype>`, the key a hash of the source folder's resolved path and its
model.bin's and config.json's size and mtime (as engine/gguf.py keys its conversions) and of the importer's
versions, so another checkpoint in a folder of the same name, one changed in place, or one an older importer read
differently, gets an import of its own. The leaf keeps a friendly name: a
checkpoint given by path is served under its folder's name. An import is written as
`<cache>/whisper/<key>-<name>-<dtype>.partial` first, where the start-up cleanup looks for interrupted ones.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

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
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:_KEY_CHARS]


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
    CheckpointFormatError for a model.bin that is no Whisper, OSError when the cache cannot be written."""
    from audio.ctranslate2_import import import_ct2_whisper
    key = source_key(ct2_dir)
    out = root / key / f"{name}-{dtype}"
    if is_whisper_checkpoint(out):
        return out
    # Staged at the top level (import_ct2_whisper adds .partial), then moved under the key in one rename.
    staged = root / f"{key}-{out.name}"
    if not is_whisper_checkpoint(staged):  # else a start stopped between the two renames: the move is left
        _log.info("first use of Whisper %s (%s): importing its CTranslate2 weights (%s) into %s (once)", name,
                  ct2_dir, dtype, out)
        import_ct2_whisper(ct2_dir, staged, dtype=dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        shutil.rmtree(out)  # an unreadable leftover: it would block the rename
    try:
        staged.rename(out)
    except OSError:
        if not is_whisper_checkpoint(out):  # else another process imported the same source first
            raise
    return out


def keyed_imports(root: Path) -> list[Path]:
    """Imports under `root` (`<key>/<name>-<dtype>`), by name, the newest first among those of one name (a
    lookup by name takes the first). Raises nothing."""
    try:
        found = [leaf for key in root.iterdir() if key.is_dir() and not is_whisper_checkpoint(key)
                 for leaf in key.iterdir() if is_whisper_checkpoint(leaf)]
        return sorted(found, key=lambda p: (p.name, -p.stat().st_mtime_ns, str(p)))
    except OSError:
        return []


def unkeyed_imports(root: Path) -> list[Path]:
    """Checkpoints directly in `root`: imports by older versions (keyed by folder name only, so never reused) or
    one whose move under its key was cut short. Raises nothing."""
    try:
        return sorted(p for p in root.iterdir() if is_whisper_checkpoint(p))
    except OSError:
        return []
