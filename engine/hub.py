"""The local Hugging Face hub cache: where it is, a repository's snapshot in it, what it holds
(`tandem models ls`) and the one call that downloads into it (`tandem models get`). Resolving and loading a
model from it is engine/models.py.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal

from engine.errors import ModelNotFound

__all__ = ["MODEL_FILE_PATTERNS", "CachedModel", "ModelDownloadError", "cached_repo_id", "download_model",
           "hub_cache_dir", "list_cached_models", "snapshot_dir"]

# What `tandem models get` fetches: mlx-lm's own patterns plus mlx-whisper's weight files and a faster-whisper
# (CTranslate2) repo's model.bin (its vocabulary is .txt or .json). Never every GGUF, nor duplicate checkpoints
# such as consolidated.safetensors or pytorch_model.bin.
MODEL_FILE_PATTERNS = [
    "*.json",
    "model*.safetensors",
    "weights.safetensors",
    "weights.npz",
    "model.bin",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
]


class ModelDownloadError(RuntimeError):
    """`download_model` could not fetch the repository (network, permissions, gated repo)."""


@dataclass(frozen=True)
class CachedModel:
    """One repository in the local Hugging Face cache, as `tandem models ls` shows it."""

    repo_id: str
    kind: Literal["llm", "whisper", "other"]
    size_bytes: int
    path: Path
    # What the cache scan found wrong with it ("incomplete: …" for missing blobs, "broken: …"); None when sound.
    problem: str | None = None


_log = logging.getLogger(__name__)


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment at call time. Raises nothing."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def cached_repo_id(repo_dir: Path) -> str | None:
    """The model repo id a cache folder holds ("models--org--name" → "org/name", "models--gpt2" → "gpt2"); None
    for any other folder. Raises nothing."""
    if not repo_dir.name.startswith("models--"):
        return None
    # Repo ids cannot hold "--" (huggingface_hub refuses them), so the folder name splits back unambiguously.
    parts = repo_dir.name.removeprefix("models--").split("--")
    return "/".join(parts) if len(parts) <= 2 and all(parts) else None


def snapshot_dir(repo_id: str, *, warn: bool = True) -> Path | None:
    """The cached snapshot of `repo_id` that refs/main names, else the newest one (with a warning unless not `warn`);
    None when absent."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.file_download import repo_folder_name

    try:
        repo_dir = hub_cache_dir() / repo_folder_name(repo_id=repo_id, repo_type="model")
    except HFValidationError:  # not a valid repo id, so nothing of that name can be cached
        return None
    ref = repo_dir / "refs" / "main"
    named = ref.read_text().strip() if ref.is_file() else None
    if named and (repo_dir / "snapshots" / named).is_dir():
        return repo_dir / "snapshots" / named
    snapshots = [p for p in (repo_dir / "snapshots").glob("*") if p.is_dir()]
    if not snapshots:
        return None
    newest = max(snapshots, key=lambda p: p.stat().st_mtime)
    if named and warn:  # an interrupted download: say which snapshot serves instead, or its errors look unrelated
        _log.warning("%s: refs/main names snapshot %s, which is not in the cache; using %s", repo_id, named,
                     newest.name)
    return newest


def list_cached_models() -> list[CachedModel]:
    """Model repositories in the local Hugging Face cache, sorted by repo id; those the scan finds damaged (a ref
    naming a missing commit, a missing blob) too, with `problem` saying what is wrong, since `tandem serve` may still
    serve them. Raises nothing."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(hub_cache_dir())
    except CacheNotFound:
        return []
    models = []
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        snapshot = snapshot_dir(repo.repo_id) or repo.repo_path
        models.append(CachedModel(repo.repo_id, _kind(repo.repo_id, snapshot), repo.size_on_disk, snapshot))
    # The scan leaves out a repo it cannot read whole, leaving only a warning that names a path inside it.
    scanned = {repo.repo_path for repo in info.repos}
    for repo_dir in sorted(Path(hub_cache_dir()).resolve().glob("models--*")):
        repo_id = cached_repo_id(repo_dir)
        said = [str(w) for w in info.warnings if f"{repo_dir}/" in str(w) or f"{repo_dir})" in str(w)
                or str(w).endswith(str(repo_dir))]
        if repo_dir in scanned or repo_id is None or not said:
            continue
        snapshot = snapshot_dir(repo_id, warn=False) or repo_dir
        models.append(CachedModel(repo_id, _kind(repo_id, snapshot), _blob_bytes(repo_dir), snapshot,
                                  _damage(repo_dir) or f"broken: {said[0]}"))
    return sorted(models, key=lambda m: m.repo_id)


def _damage(repo_dir: Path) -> str | None:
    """What is wrong with a cached repo, in words: files whose blobs are missing, refs naming missing commits. None
    when neither. Raises nothing."""
    snapshots = repo_dir / "snapshots"
    missing = sorted({str(p.relative_to(s)) for s in snapshots.glob("*") if s.is_dir()
                      for p in s.rglob("*") if p.is_symlink() and not p.exists()})
    if missing:
        return f"incomplete: {', '.join(missing)} missing (the blob{'s are' if len(missing) > 1 else ' is'} not in " \
               "the cache)"
    refs = repo_dir / "refs"
    for ref in sorted(refs.rglob("*")) if refs.is_dir() else []:
        try:
            commit = ref.read_text().strip() if ref.is_file() else ""
        except OSError:
            continue
        if commit and not (snapshots / commit).is_dir():
            return f"broken: refs/{ref.relative_to(refs)} names commit {commit}, which is not in the cache"
    return None


def _blob_bytes(repo_dir: Path) -> int:
    try:
        return sum(p.stat().st_size for p in (repo_dir / "blobs").iterdir() if p.is_file())
    except OSError:
        return 0


def _kind(repo_id: str, snapshot: Path) -> Literal["llm", "whisper", "other"]:
    config: dict[str, Any] = {}
    try:
        config = json.loads((snapshot / "config.json").read_text())
    except (OSError, ValueError):
        pass
    if "whisper" in str(config.get("model_type", "")) or "n_mels" in config or "whisper" in repo_id.lower():
        return "whisper"
    model_type = config.get("model_type")
    if isinstance(model_type, str) and importlib.util.find_spec(f"mlx_lm.models.{model_type}") is not None:
        return "llm"
    if any(snapshot.glob("*.gguf")):
        return "llm"
    return "other"


@contextmanager
def _progress_bars(enabled: bool) -> Iterator[None]:
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_disabled = are_progress_bars_disabled()
    if enabled:
        enable_progress_bars()
    else:
        disable_progress_bars()
    try:
        yield
    finally:
        (disable_progress_bars if was_disabled else enable_progress_bars)()


def download_model(repo: str, progress: bool = True) -> Path:
    """Download `repo` ("org/name", or "org/name/file.gguf" for one GGUF) into the HF cache; return its path.

    Shows tqdm progress bars when `progress`. Raises ModelNotFound when the repository or file does not
    exist, ModelDownloadError for any other failure (no network, gated repository, disk).
    """
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
    )

    parts = repo.strip("/").split("/")
    try:
        with _progress_bars(progress):
            if len(parts) == 3 and parts[2].lower().endswith(".gguf"):
                return Path(hf_hub_download("/".join(parts[:2]), parts[2], cache_dir=hub_cache_dir()))
            return Path(snapshot_download(repo, cache_dir=hub_cache_dir(), allow_patterns=MODEL_FILE_PATTERNS))
    except GatedRepoError as exc:
        raise ModelDownloadError(f"{repo!r} is gated: accept its terms on the hub and log in first ({exc})") from exc
    except LocalEntryNotFoundError as exc:
        # Raised when the hub cannot be reached (or HF_HUB_OFFLINE is set) and nothing is cached.
        raise ModelDownloadError(f"could not reach the Hugging Face hub to download {repo!r}: {exc}") from exc
    except (RepositoryNotFoundError, RemoteEntryNotFoundError, HFValidationError) as exc:
        raise ModelNotFound(f"{repo!r} was not found on the Hugging Face hub: {exc}") from exc
    except (OSError, ValueError) as exc:
        raise ModelDownloadError(f"could not download {repo!r}: {exc}") from exc
