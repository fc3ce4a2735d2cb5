"""Model names on the command line → files, failing with one line that says what to do."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from service.cli.errors import CLIError

if TYPE_CHECKING:
    from engine.models import ModelSource

__all__ = ["resolve_adapter", "resolve_chat_model", "whisper_spec"]


def resolve_chat_model(spec: str | None) -> ModelSource:
    """Resolve a chat model spec (a dir, a .gguf, a cached repo id, "demo" or the demo's id)
    without loading it. Raises CLIError with how to get a model when nothing matches."""
    from engine.errors import ModelNotFound
    from engine.models import resolve_model

    try:
        return resolve_model(spec)
    except ModelNotFound as exc:
        raise CLIError(f"no model: {exc}") from None


def whisper_spec(spec: str | None) -> str | None:
    """A Whisper model as given, or the directory of the local checkpoint `tandem models ls` lists under
    that name (an import in the user cache, e.g. tiny.en-float32) when no file of that name exists.
    Raises nothing."""
    from pathlib import Path

    if spec is None or Path(spec).expanduser().exists():
        return spec
    from audio.whisper import local_whisper_models

    match = next((w for w in local_whisper_models() if w.name == spec and w.note == "imported"), None)
    return str(match.path) if match is not None else spec


def resolve_adapter(path: str | None) -> str | None:
    """--adapter-path checked before any model loads, as an absolute path (an --isolate child may start elsewhere);
    None stays None. Raises CLIError naming what the folder lacks."""
    if path is None:
        return None
    if not path.strip():  # --adapter-path= was read as the current folder
        raise CLIError("--adapter-path is empty: give the adapter's folder")
    from engine.adapters import AdapterError, check_adapter_dir

    try:
        check_adapter_dir(path)
    except AdapterError as exc:
        raise CLIError(f"--adapter-path: {exc}") from None
    return str(Path(path).resolve())
