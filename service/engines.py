"""How the app factory builds its engine: around the configured chat model, or tasks-only (a
transcription-only server). The factory (service/app.py) runs these at startup and owns the result."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from service.config import ServiceConfig
from service.seams import ChatEngine

__all__ = ["open_engine", "open_tasks_engine", "ModelFileError", "model_file_problem", "broken_model_file"]

# A safetensors header larger than this is garbage, not a header (real ones are a few MB at most).
_MAX_HEADER_BYTES = 100 * 1024 * 1024


class ModelFileError(Exception):
    """A model file that cannot be used; the message names the file and what is wrong with it."""


async def open_engine(config: ServiceConfig) -> ChatEngine:
    """Load the configured chat model and build the engine around it.

    Raises engine.errors.ModelNotFound when no model can be found, ModelFileError when a file of a model
    directory is broken (config.json, a safetensors file), and whatever else loading raises."""
    from engine.errors import EngineError
    from engine.runtime import Engine

    try:
        # The model loads on the engine's own thread (MLX streams are per thread), off the event loop.
        return await Engine.open(config.model, max_active=config.max_active, max_queued=config.queue_limit,
                                 max_iteration_tokens=config.max_iteration_tokens, prefill_stall=config.prefill_stall,
                                 decode_burst=config.decode_burst,
                                 prompt_cache_bytes=config.prompt_cache_bytes, memory_budget=config.memory_budget,
                                 chat_template=config.chat_template, adapter_path=config.adapter_path)
    except EngineError:
        raise  # the engine's own errors already say what and where
    except Exception as exc:
        # mlx-lm's errors name neither the file nor the fault ("Unable to read 8 bytes", "ModelArgs missing 5
        # arguments"): look at the files to say which one is broken.
        problem = model_file_problem(config.model, exc)
        if problem is None:
            raise
        raise ModelFileError(problem) from exc


async def open_tasks_engine(config: ServiceConfig) -> ChatEngine:
    """An engine with no chat model: its loop runs speech tasks only. Raises nothing."""
    from engine.runtime import Engine

    return Engine(None)


def model_file_problem(spec: str | None, error: BaseException) -> str | None:
    """Which file of the HF-layout directory `spec` names is broken and how, given the `error` its load raised;
    None when the files look sound (or `spec` is not such a directory). Raises nothing."""
    from engine.models import resolve_model

    try:
        source = resolve_model(spec)
    except Exception:
        return None
    if source.kind != "hf_dir":
        return None  # GGUF errors name the file already; its conversion is ours
    directory = Path(source.path)
    if (problem := broken_model_file(directory)) is not None:
        return problem
    config = directory / "config.json"
    try:
        described = json.loads(config.read_text())
    except (OSError, ValueError):  # changed since it was checked
        described = {}
    kind = described.get("model_type", "?") if isinstance(described, dict) else "?"
    if isinstance(error, ValueError) and (problem := _weights_problem(directory, described, str(error))) is not None:
        return problem
    if isinstance(error, (TypeError, KeyError, ValueError, AttributeError)):
        # The files read, so the model could not be built from what config.json says.
        return f"{config} does not describe a usable {kind!s} model: {type(error).__name__}: {error}"
    return None


# mlx's Module.load_weights, when the weights and the model config.json describes differ (its words, one name a line).
_EXTRA = re.compile(r"Received (\d+) parameters not in model:\s*(.*?)\.?\s*$", re.S)
_MISSING = re.compile(r"Missing (\d+) parameters:\s*(.*?)\.?\s*$", re.S)
_SHAPE = re.compile(r"Expected shape (\(.*?\)) but received shape (\(.*?\)) for parameter (\S+)")


def _weights_problem(directory: Path, config: dict[str, object], error: str) -> str | None:
    """mlx's complaint that the weights and the model config.json describes differ, put as what is wrong with which
    weights file: tensors it holds that the model has no place for, tensors the model needs that no file holds, a
    tensor of the wrong shape. None for any other error. Raises nothing."""
    files = sorted(directory.glob("model*.safetensors"))  # the files mlx-lm loads
    kind = config.get("model_type", "?")
    if extra := _EXTRA.search(error):
        names = _names(extra.group(2))
        holders = [f for f in files if set(names) & _tensor_names(f)] or files
        return (f"{_files(directory, holders)} {'holds' if len(holders) == 1 else 'hold'} {extra.group(1)} "
                f"tensor{'s' if extra.group(1) != '1' else ''} that the {kind} model of config.json has no place for: "
                f"{_listed(names)}")
    if missing := _MISSING.search(error):
        names = _names(missing.group(2))
        untied = "lm_head.weight" in names and config.get("tie_word_embeddings") is False
        why = (" (config.json has tie_word_embeddings: false, so the output layer needs its own lm_head)"
               if untied else "")
        return (f"{_files(directory, files)} {'lacks' if len(files) == 1 else 'lack'} {missing.group(1)} "
                f"tensor{'s' if missing.group(1) != '1' else ''} that the {kind} model of config.json needs: "
                f"{_listed(names)}{why}")
    if shape := _SHAPE.search(error):
        name = shape.group(3)
        holders = [f for f in files if name in _tensor_names(f)] or files
        return (f"{_files(directory, holders)}: tensor {name} has shape {shape.group(2)}, but the {kind} model of "
                f"config.json needs {shape.group(1)}")
    return None


def _names(listing: str) -> list[str]:
    return [n.strip() for n in listing.replace("\n", "").split(",") if n.strip()]


def _listed(names: list[str], most: int = 5) -> str:
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def _files(directory: Path, files: list[Path]) -> str:
    if not files:
        return f"{directory} (no model*.safetensors)"
    if len(files) <= 3:
        return ", ".join(str(f) for f in files)
    return f"{directory}/model*.safetensors ({len(files)} files)"


def _tensor_names(path: Path) -> set[str]:
    """The tensor names a safetensors file's header lists (the safetensors package reads the header only); empty
    when it does not read. Raises nothing."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            return set(f.keys())
    except Exception:  # noqa: BLE001 — a file that does not read names nothing
        return set()


def broken_model_file(directory: Path) -> str | None:
    """The first broken file of an HF-layout model directory and what is wrong with it: config.json that does not
    read or parse, a safetensors file that is empty, truncated or not one (headers only: cheap to run before a
    load). None when they look sound. Raises nothing."""
    config = directory / "config.json"
    try:
        parsed = json.loads(config.read_text())
    except OSError as exc:
        return f"{config}: cannot be read ({exc.strerror or exc})"
    except ValueError as exc:
        return f"{config} is not valid JSON ({exc}): an incomplete download or a bad edit?"
    if not isinstance(parsed, dict):
        return f"{config} is not a JSON object"
    for weights in sorted(directory.glob("*.safetensors")):
        if (problem := _safetensors_problem(weights)) is not None:
            return f"{weights} {problem}"
    return None


def _safetensors_problem(path: Path) -> str | None:
    """What is wrong with a safetensors file's framing (size, header, data extent), or None. Raises nothing."""
    try:
        size = path.stat().st_size
        if size == 0:
            return "is empty (0 bytes): an incomplete download?"
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"is {size} bytes, too short for a safetensors header: an incomplete download?"
            length = struct.unpack("<Q", head)[0]
            if length > min(size - 8, _MAX_HEADER_BYTES):
                return "is not a safetensors file (its header length is past the end of the file)"
            header = json.loads(f.read(length))
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    except ValueError:
        return "is not a safetensors file (its header is not valid JSON)"
    if not isinstance(header, dict):
        return "is not a safetensors file (its header is not a JSON object)"
    try:
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (TypeError, KeyError, IndexError, ValueError):
        return "is not a safetensors file (its header lists no data offsets)"
    if 8 + length + end > size:
        return (f"is truncated: {size} bytes, but its tensors need {8 + length + end} "
                "(an incomplete download?)")
    return None
