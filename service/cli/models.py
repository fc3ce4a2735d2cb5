"""`tandem models [ls] | get REPO | import CT2_DIR OUT | rm NAME|--partial`: what is on this machine, download,
convert, remove what tandem converted or imported."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from service.cli.errors import CLIError
from service.cli.parsers import add_command

if TYPE_CHECKING:
    from service.cli.model_cache import CacheEntry

__all__ = ["add_models"]


def add_models(sub: Any) -> None:
    """Register `tandem models` and its subcommands. Raises nothing."""
    p = add_command(sub, "models", "list (the default), download or import models")
    p.set_defaults(func=_models_ls)  # `tandem models` alone lists, as `ls` does
    msub = p.add_subparsers(dest="models_command")
    ls = add_command(msub, "ls", "chat and Whisper models on this machine (HF cache, demo, GGUF conversions, imports, "
                                 "and what interrupted ones left)")
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
    rm = add_command(msub, "rm", "remove a GGUF conversion or Whisper import tandem made (as `models ls` names it), "
                                 "or with --partial what interrupted ones left; never the HF cache or your folders")
    rm.add_argument("name", nargs="?", default=None,
                    help="the name `models ls` shows (every import of that name), or its path (default: none)")
    rm.add_argument("--partial", action="store_true",
                    help="remove what interrupted conversions and imports left (`models ls`: partial)")
    rm.add_argument("--yes", "-y", action="store_true", help="remove without asking (needed without a terminal)")
    rm.set_defaults(func=_models_rm)


def _row(name: str, kind: str, size_bytes: int, path: Path | str, problem: str | None = None,
         note: str | None = None) -> str:
    row = f"{name:50s} {kind:8s} {size_bytes / 1e6:10.1f} MB  {path}" + (f"  {note}" if note else "")
    return f"{row}  [{problem}]" if problem else row


def _made_from(source: str | None) -> str:
    if source is None:
        return "from an unrecorded source (written before source.json)"
    return f"from {source}" + ("" if os.path.exists(source) else " (gone)")


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
    from service.cli.model_cache import cache_entries, leftovers

    for c in cache_entries():
        if c.kind == "llm":  # the Whisper imports are listed above
            print(_row(f"{c.name} ({c.note})", c.kind, c.size_bytes, c.path, note=_made_from(c.source)))
    for left in leftovers():
        print(_row(left.path.name, "partial", left.size_bytes, left.path,
                   "partial (interrupted import): `tandem models rm --partial` removes it"))
    return 0


def _models_rm(args: argparse.Namespace) -> int:
    from service.cli.model_cache import cache_entries, leftovers, no_server_loading, remove_entry, remove_leftover

    if args.partial == (args.name is not None):
        raise CLIError("give a NAME from `tandem models ls`, or --partial for what interrupted imports left")
    with no_server_loading():
        removals: list[tuple[str, int, Callable[[], None]]]
        if args.partial:
            found = leftovers()
            if not found:
                print("nothing left by interrupted conversions or imports", file=sys.stderr)
                return 0
            removals = [(str(f.path), f.size_bytes, functools.partial(remove_leftover, f)) for f in found]
            what = f"{len(found)} partial file{'s' if len(found) != 1 else ''} of interrupted imports"
        else:
            entries = _named(args.name, cache_entries())
            removals = [(f"{e.name} ({e.path})", e.size_bytes, functools.partial(remove_entry, e)) for e in entries]
            what = ", ".join(sorted({e.name for e in entries}))
            what += f" ({len(entries)} copies)" if len(entries) > 1 else ""
        total = sum(size for _, size, _ in removals)
        if not _confirmed(f"remove {what}, {total / 1e6:.1f} MB?", args.yes):
            print("nothing removed", file=sys.stderr)
            return 1
        for shown, size, remove in removals:
            try:
                remove()
            except OSError as exc:
                raise CLIError(f"cannot remove {shown}: {exc.strerror or exc}", code=1) from None
            print(f"removed {shown}: {size / 1e6:.1f} MB")
    print(f"freed {total / 1e6:.1f} MB")
    return 0


def _named(name: str, entries: list[CacheEntry]) -> list[CacheEntry]:
    """The cache entries `name` names: by the name `models ls` shows (its note in parentheses may be given too),
    or by path. Raises CLIError naming why another model is not removed here."""
    bare = name.strip()
    if bare.endswith(")") and " (" in bare:
        bare = bare[:bare.rindex(" (")]
    target = Path(bare).expanduser()
    by_path = target.resolve() if target.exists() else None
    matched = [e for e in entries if e.name == bare or (by_path is not None and e.path.resolve() == by_path)]
    if matched:
        return matched
    raise CLIError(_not_ours(bare, by_path))


def _not_ours(name: str, path: Path | None) -> str:
    """Why `name` is nothing `models rm` removes. Raises nothing."""
    from audio.whisper import DEMO_ALIASES
    from engine.backend import user_cache_dir
    from engine.hub import list_cached_models
    from engine.models import DEMO_MODEL_ID

    if path is None and any(m.repo_id == name for m in list_cached_models()):
        return (f"{name} is in the Hugging Face cache, which tandem does not remove: use `hf cache rm` "
                "(huggingface_hub's CLI)")
    if name in DEMO_ALIASES or name == DEMO_MODEL_ID:
        return f"{name} is the demo, part of the installed package; what tandem made of it is listed as converted"
    if path is not None:
        return f"{name} is not a conversion or import of tandem's ({user_cache_dir()}): remove your own files yourself"
    return f"no conversion or import named {name!r}: `tandem models ls` lists them (converted, imported, old import)"


def _confirmed(question: str, yes: bool) -> bool:
    """--yes, or the answer to `question` on the terminal. Raises CLIError without a terminal to ask on."""
    if yes:
        return True
    if sys.stdin is None or not sys.stdin.isatty():
        raise CLIError(f"{question[:-1]}: stdin is no terminal to ask on; pass --yes to remove without asking")
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


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
        out = import_ct2_whisper(Path(args.source), output, dtype=args.dtype)  # with a plain write's modes
    except (CheckpointFormatError, FileNotFoundError) as exc:
        raise CLIError(str(exc)) from None
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

