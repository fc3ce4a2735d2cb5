"""`tandem models [ls] | get REPO | import CT2_DIR OUT`: what is on this machine, download, convert."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from service.cli.errors import CLIError
from service.cli.parsers import add_command

__all__ = ["add_models"]


def add_models(sub: Any) -> None:
    """Register `tandem models` and its subcommands. Raises nothing."""
    p = add_command(sub, "models", "list (the default), download or import models")
    p.set_defaults(func=_models_ls)  # `tandem models` alone lists, as `ls` does
    msub = p.add_subparsers(dest="models_command")
    ls = add_command(msub, "ls", "chat and Whisper models on this machine (HF cache, demo, imports)")
    ls.set_defaults(func=_models_ls)
    get = add_command(msub, "get", "download a model repo into the Hugging Face cache")
    get.add_argument("repo", help="org/name, or org/name/file.gguf")
    get.set_defaults(func=_models_get)
    imp = add_command(msub, "import", "convert a faster-whisper (CTranslate2) Whisper dir into mlx-whisper's layout")
    imp.add_argument("source", help="dir with model.bin (CTranslate2)")
    imp.add_argument("output", help="new mlx-whisper dir (config.json + weights.safetensors)")
    imp.add_argument("--dtype", choices=["float32", "float16"], default="float32",
                     help="stored weight type (float32 suits the CPU backend)")
    imp.add_argument("--force", action="store_true",
                     help="replace an OUTPUT dir that is not empty (everything in it is removed; never the source)")
    imp.set_defaults(func=_models_import)


def _row(name: str, kind: str, size_bytes: int, path: Path | str, problem: str | None = None) -> str:
    row = f"{name:50s} {kind:8s} {size_bytes / 1e6:10.1f} MB  {path}"
    return f"{row}  [{problem}]" if problem else row


def _models_ls(_: argparse.Namespace) -> int:
    from audio.whisper import local_whisper_models
    from engine.hub import hub_cache_dir, list_cached_models
    from engine.models import DEMO_MODEL_ID, demo_model_path

    models = list_cached_models()
    if not models:
        print(f"no models in the Hugging Face cache ({hub_cache_dir()}); `tandem models get ORG/NAME` downloads one")
    for m in models:
        print(_row(m.repo_id, m.kind, m.size_bytes, m.path, m.problem))
    if (demo := demo_model_path()) is not None:
        print(_row(f"{DEMO_MODEL_ID} (demo)", "llm", demo.stat().st_size, demo))
    for w in local_whisper_models():
        print(_row(f"{w.name} ({w.note})", "whisper", w.size_bytes, w.path))
    return 0


def _models_get(args: argparse.Namespace) -> int:
    from engine.errors import ModelNotFound
    from engine.hub import ModelDownloadError, download_model

    _check_repo_id(args.repo)
    _check_hub_reachable()
    try:
        path = download_model(args.repo)
    except (ModelNotFound, ModelDownloadError) as exc:
        raise CLIError(str(exc), code=1) from None
    print(path)
    return 0


def _check_repo_id(repo: str) -> None:
    """Raise CLIError (exit 2) for text that is no repo id: the hub would call it 'not found'."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    parts = repo.strip().strip("/").split("/")
    if not repo.strip():
        raise CLIError("give a repo id: org/name, or org/name/file.gguf")
    gguf = len(parts) == 3 and parts[2].lower().endswith(".gguf")
    if len(parts) > 2 and not gguf:
        raise CLIError(f"not a repo id: {repo!r} (use org/name, or org/name/file.gguf)")
    try:
        validate_repo_id("/".join(parts[:2]))
    except HFValidationError as exc:
        raise CLIError(f"not a repo id: {repo!r} ({exc})") from None


def _check_hub_reachable(timeout: float = 5.0) -> None:
    """One quick request to the hub before downloading: unreachable, huggingface_hub retries each file
    with backoff for ~40 s, printing each retry. Raises CLIError (exit 1) when nothing answers; skipped
    when HF_HUB_OFFLINE asks for the cache only."""
    import httpx
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return
    try:
        httpx.head(constants.ENDPOINT, timeout=timeout)
    except httpx.HTTPError as exc:
        raise CLIError(f"could not reach the Hugging Face hub ({constants.ENDPOINT}): {exc or type(exc).__name__}",
                       code=1) from None


def _models_import(args: argparse.Namespace) -> int:
    from audio.ctranslate2_import import CheckpointFormatError, import_ct2_whisper

    output = Path(args.output)
    if not (Path(args.source) / "model.bin").is_file():
        raise CLIError(f"{args.source} has no model.bin (not a CTranslate2 checkpoint)")
    _check_apart(Path(args.source), output)
    if output.is_dir() and any(output.iterdir()) and not args.force:
        raise CLIError(f"{output} exists and is not empty: choose a new dir, or pass --force to replace its files")
    if output.exists() and not output.is_dir():
        raise CLIError(f"{output} exists and is not a directory")
    try:
        out = import_ct2_whisper(Path(args.source), output, dtype=args.dtype)
    except (CheckpointFormatError, FileNotFoundError) as exc:
        raise CLIError(str(exc)) from None
    _usual_modes(Path(out))
    print(out)
    return 0


def _check_apart(source: Path, output: Path) -> None:
    """Raise CLIError (exit 2) when OUTPUT is SOURCE, holds it or lies inside it: replacing OUTPUT (--force) deleted
    the checkpoint being read, and its siblings with it where OUTPUT was its parent."""
    src, out = source.resolve(), output.resolve()
    if out == src:
        raise CLIError(f"OUTPUT {output} is the source dir: choose a new dir (replacing it would delete model.bin)")
    if out in src.parents:
        raise CLIError(f"OUTPUT {output} contains the source dir {source}: choose a new dir (replacing it would "
                       f"delete the source and everything beside it)")
    if src in out.parents:
        raise CLIError(f"OUTPUT {output} is inside the source dir {source}: choose a dir outside it")


def _usual_modes(directory: Path) -> None:
    """Give the files written the mode a plain write gets (the weights came out 0600: written through a
    private temporary file). Raises nothing."""
    mask = os.umask(0)
    os.umask(mask)
    for path in directory.iterdir():
        if path.is_file():
            try:
                path.chmod(0o666 & ~mask)
            except OSError:
                pass
