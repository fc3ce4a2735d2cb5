"""How the app factory builds its engine: around the configured chat model, or tasks-only (a
transcription-only server). The factory (service/app.py) runs these at startup and owns the result."""

from __future__ import annotations

import json
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
                                 prompt_cache_bytes=config.prompt_cache_bytes, memory_budget=config.memory_budget)
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
    if isinstance(error, (TypeError, KeyError, ValueError, AttributeError)):
        # The files read, so the model could not be built from what config.json says.
        config = directory / "config.json"
        try:
            kind = json.loads(config.read_text()).get("model_type", "?")
        except (OSError, ValueError):  # changed since it was checked
            kind = "?"
        return f"{config} does not describe a usable {kind!s} model: {type(error).__name__}: {error}"
    return None


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
