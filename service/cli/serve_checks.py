"""What `tandem serve` checks of its chat model before it binds the port, from file headers and sizes only (the
worker loads the weights, once): a damaged download, a file that is not GGUF or of an architecture the import does
not map, a Whisper checkpoint given as the chat model, and a --memory-budget smaller than the weights. Each was a
worker that failed after the banner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.cli.errors import CLIError

if TYPE_CHECKING:
    from engine.models import ModelSource

__all__ = ["check_chat_model"]


def check_chat_model(source: ModelSource, memory_budget: int | None, **plan: int) -> None:
    """Raise CLIError (exit 2) naming what is wrong with the chat model `source` or the budget for it (`plan`:
    max_iteration_tokens and max_active, which size its fixed shares). Reads headers, config.json and file sizes;
    loads nothing."""
    path = Path(source.path)
    if source.kind == "gguf":
        config, stored = _checked_gguf(source.name, path)
        if memory_budget is not None:
            _check_budget(source.name, config, stored, memory_budget, plan)
        return
    _check_hf_dir(source.name, path)
    if memory_budget is not None:
        from engine.cpu_weights import weight_sizes

        config = _config(path)
        _check_budget(source.name, config, int(weight_sizes(path, config).stored), memory_budget, plan)


def _check_budget(name: str, config: dict[str, Any], stored: int, budget: int, plan: dict[str, int]) -> None:
    """The weights as they load (float32 on the CPU where that fits, else as stored, `stored` bytes:
    engine/cpu_weights.py, engine/gguf_sizes.py) beside the budget's fixed shares, held against `budget`. Raises
    CLIError when even the stored size does not fit."""
    from engine.cpu_weights import room_for
    from engine.memory import size_text

    room = room_for(config, budget, **plan)
    if stored > room:
        raise CLIError(f"--memory-budget {size_text(budget)} cannot hold {name}'s weights ({size_text(stored)} in "
                       f"memory, quantized layers kept quantized) beside its buffer cache, activations and one row "
                       f"of KV ({size_text(max(0, budget - room))}): raise it, or leave it out for the machine's default")


def _checked_gguf(name: str, path: Path) -> tuple[dict[str, Any], int]:
    """(the config.json its conversion writes, as the memory plan reads it; the bytes of its weights with the
    quantized tensors kept), once its header reads and maps, and its tensor types are ones the import takes.
    Raises CLIError."""
    from engine.gguf_header import GGUFError, read_header
    from engine.gguf_plan import gguf_plan_config
    from engine.gguf_sizes import gguf_sizes
    from engine.gguf_tensors import check_types

    try:
        # The header (metadata and tensor table), never the tensors: the conversion reads it again, cheaply.
        metadata, tensors = read_header(path)
        config = gguf_plan_config(metadata, tensors)
        check_types(tensors, path)
    except GGUFError as exc:
        raise CLIError(f"cannot load model {name}: {exc}") from None
    except OSError as exc:
        raise CLIError(f"cannot load model {name}: cannot read {path}: {exc.strerror or exc}") from None
    return config, int(gguf_sizes(tensors).stored)


def _check_hf_dir(name: str, path: Path) -> None:
    from engine.checkpoint_checks import checked_overrides
    from engine.errors import ModelUnsupported
    from service.engines import broken_model_file

    # Headers only: an empty or truncated download is one line here, not a worker that starts and fails.
    if (problem := broken_model_file(path)) is not None:
        raise CLIError(f"cannot load model {name}: {problem}")
    try:  # a quantization or RoPE form the load would refuse, refused before the banner
        checked_overrides(_config(path))
    except ModelUnsupported as exc:
        raise CLIError(f"cannot load model {name}: {exc}") from None
    if (layout := _whisper_layout(path)) is not None:
        raise CLIError(f"{path} is a Whisper model ({layout}), not a chat model: serve it alone for transcription "
                       "only, or pass it as --whisper-model beside a chat model"
                       if layout != "Hugging Face transformers" else
                       f"{path} is a Whisper model in Hugging Face transformers' layout, not a chat model, and not a "
                       "layout served for speech either: use an mlx-whisper or faster-whisper (CTranslate2) "
                       "checkpoint, as --whisper-model")


def _whisper_layout(path: Path) -> str | None:
    """Which Whisper layout the folder `path` holds ("mlx-whisper", "CTranslate2", "Hugging Face transformers"),
    or None when it is no Whisper. Raises nothing."""
    from audio.ctranslate2_import import is_ct2_whisper_dir
    from audio.whisper_imports import is_whisper_checkpoint

    if is_whisper_checkpoint(path):
        return "mlx-whisper"
    if is_ct2_whisper_dir(path) and not any(path.glob("*.safetensors")):
        return "CTranslate2"
    config = _config(path)
    architectures = config.get("architectures") or []
    if config.get("model_type") == "whisper" or any("Whisper" in str(a) for a in architectures):
        return "Hugging Face transformers"
    return None


def _config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}

