"""MemoryBudget — one byte budget for everything the engine holds, and the allocator settings that keep
the process's memory equal to what it holds.

The budget is split once, at start: model weights, the prefix cache's share, MLX's buffer cache
(`mx.set_cache_limit`) and a headroom for one iteration's activations; what is left is for KV (decode
slots and prefill caches). Admission (engine/batch.py) keeps a row queued while its KV would not fit and
refuses one that can never fit (engine.errors.MemoryAdmission, code `context_over_budget`). A row's KV is charged by
how its caches grow (engine/kv_shape.py): bytes a token for the layers that keep every token, and at most a fixed
share a row for sliding windows and recurrent states.

Default total: on a GPU a fraction of the device's memory (Metal: the recommended working set; CUDA: total
memory), on the CPU a fraction of physical RAM, or of this process's cgroup memory limit where lower
(engine/cgroup_limits.py: v1 or v2, its own cgroup and their parents).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any

from engine import cgroup_limits
from engine.errors import ModelUnsupported
from engine.kv_shape import KVShape, kv_shape
from engine.model_args import text_args

__all__ = ["MemoryBudget", "machine_memory", "kv_token_bytes", "weight_bytes", "configure_allocator",
           "release_free_memory", "process_rss", "activation_bytes", "buffer_cache_bytes", "kv_width", "size_text"]

GPU_FRACTION = 0.85  # of the device's memory: the rest is the driver's, the display's, other processes'
CPU_FRACTION = 0.6  # of RAM: Python, tokenizers, the HTTP server and the OS page cache need the rest
PREFIX_CACHE_SHARE = 0.25  # at most this share of (budget - weights) for the prefix cache by default
BUFFER_CACHE_SHARE = 0.05  # MLX keeps freed buffers for reuse up to this share of the budget
MIB = 1 << 20


def machine_memory() -> tuple[int, str]:
    """(bytes the engine may use by default, where that figure came from). Raises nothing."""
    import mlx.core as mx

    try:
        on_gpu = mx.default_device() == mx.gpu
        info: dict[str, Any] = dict(mx.device_info()) if on_gpu else {}
    except Exception:  # a backend without device_info: treat as CPU
        on_gpu, info = False, {}
    for key in ("max_recommended_working_set_size", "total_memory", "memory_size"):
        value = info.get(key)
        if isinstance(value, int) and value > 0:
            return int(value * GPU_FRACTION), f"{GPU_FRACTION:.0%} of the GPU's {key} ({value / (1 << 30):.1f} GiB)"
    ram, what = _physical_ram()
    return int(ram * CPU_FRACTION), f"{CPU_FRACTION:.0%} of {what} ({ram / (1 << 30):.1f} GiB)"


def _physical_ram() -> tuple[int, str]:
    """(bytes, what they are): RAM, or the process's cgroup memory limit where lower (what the kernel enforces)."""
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        ram = 8 << 30
    limit = cgroup_limits.memory_limit()
    return (limit, "the cgroup's memory limit") if limit is not None and limit < ram else (int(ram), "RAM")


def weight_bytes(model: Any) -> int:
    """Bytes of the model's parameters. Raises nothing."""
    from mlx.utils import tree_flatten

    try:
        leaves: list[Any] = list(tree_flatten(model.parameters()))
        return int(sum(leaf[1].nbytes for leaf in leaves if hasattr(leaf[1], "nbytes")))
    except Exception:  # an exotic module tree: count nothing rather than fail start-up
        return 0


def kv_token_bytes(model: Any) -> int:
    """KV bytes one token takes across all layers (keys + values): from the first layer whose attention has a `k_proj`
    (a hybrid stack's recurrent layers, Qwen3.5's first among them, have none), else from the config, the language
    model's where the checkpoint nests it (fused q/k/v projections as Phi-3's, DeepSeek's latent attention, attention
    under another name). Every layer is charged as if it attended: the budget's charge where every cache is a KVCache,
    or where engine/kv_shape.py cannot read the caches (it only over-reserves there). Raises ValueError when neither
    says."""
    inner = getattr(model, "model", model)
    layers = list(getattr(inner, "layers", None) or getattr(model, "layers", []))
    for layer in layers:
        if per_layer := _attention_bytes(getattr(layer, "self_attn", None)):
            return len(layers) * per_layer
    args = text_args(model)
    per_layer = kv_width(args)
    if not per_layer and _state_space(model):
        # A state-space model's cache is a fixed state per row, not per token: a token is charged one width of
        # the model, so the budget still bounds rows × length.
        per_layer = 2 * int(getattr(args, "hidden_size", 0) or getattr(args, "d_model", 0))
    if not per_layer:
        raise ValueError("neither attention layers nor a config to size the KV cache from")
    return per_layer * (len(layers) or int(getattr(args, "num_hidden_layers", 0))) * _float_size(model)


def _attention_bytes(attn: Any) -> int:
    """Keys' plus values' bytes a token takes in one attention layer, from its `k_proj` (0 without one)."""
    proj = getattr(attn, "k_proj", None)
    # A live LoRA layer (an adapter on a quantized base, engine/adapters.py) wraps the projection it adapts.
    proj = getattr(proj, "linear", proj)
    n_kv = int(getattr(attn, "n_kv_heads", 0) or getattr(attn, "num_key_value_heads", 0)) if attn is not None else 0
    if proj is None or not n_kv:
        return 0
    # Quantized projections keep their activations' dtype in `scales`; plain ones in `weight`.
    dtype = getattr(proj, "scales", None)
    dtype = (dtype if dtype is not None else proj.weight).dtype
    out_features = int(getattr(proj, "scales", proj.weight).shape[0])
    return 2 * n_kv * (out_features // n_kv) * dtype.size


def _state_space(model: Any) -> bool:
    """True when every cache the model makes is a fixed-size state (Mamba's), none grows with tokens."""
    from mlx_lm.models.cache import ArraysCache, make_prompt_cache

    try:
        caches = make_prompt_cache(model)
    except Exception:  # noqa: BLE001 — a model that cannot say: not a state-space one
        return False
    return bool(caches) and all(isinstance(c, ArraysCache) for c in caches)


def kv_width(args: Any) -> int:
    """Keys' plus values' elements a token takes in one layer, from a model config (0 when it does not say)."""
    def get(*names: str) -> int:
        for name in names:
            value = getattr(args, name, None)
            if isinstance(value, int) and value > 0:
                return value
        return 0

    heads = get("num_attention_heads", "n_heads", "num_heads", "n_head")
    if (nope := get("qk_nope_head_dim")) and (v := get("v_head_dim")):  # latent attention: mlx-lm caches every head
        return heads * (nope + get("qk_rope_head_dim") + v)
    kv = get("num_key_value_heads", "n_kv_heads", "num_kv_heads") or heads
    head_dim = get("head_dim") or (get("hidden_size", "d_model", "n_embd") // heads if heads else 0)
    return 2 * kv * head_dim


def _float_size(model: Any) -> int:
    """Bytes of the model's activations' float type: its most common floating parameter dtype (2 when none)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    counts: dict[Any, int] = {}
    leaves: list[Any] = [pair[1] for pair in tree_flatten(model.parameters())]
    for leaf in leaves:
        if isinstance(leaf, mx.array) and mx.issubdtype(leaf.dtype, mx.floating):
            counts[leaf.dtype] = counts.get(leaf.dtype, 0) + leaf.size
    return max(counts, key=lambda d: counts[d]).size if counts else 2


@dataclass(frozen=True)
class MemoryBudget:
    """The split of `total` bytes (see module doc). `kv` is what admission may reserve for rows; the `kv_*_bytes`
    fields are a row's KV by how it grows (engine/kv_shape.py's KVShape): `kv_token_bytes` a token in the layers that
    keep every token, the others what sliding windows and fixed states hold."""

    total: int
    weights: int
    prefix_cache: int
    buffer_cache: int
    activations: int
    kv_token_bytes: int
    source: str = "configured"
    kv_state_bytes: int = 0
    kv_window_token_bytes: int = 0
    kv_window_bytes: int = 0

    @property
    def kv(self) -> int:
        return max(0, self.total - self.weights - self.prefix_cache - self.buffer_cache - self.activations)

    @property
    def kv_shape(self) -> KVShape:
        return KVShape(self.kv_token_bytes, self.kv_state_bytes, self.kv_window_token_bytes, self.kv_window_bytes)

    @classmethod
    def plan(cls, model: Any, *, total: int | None = None, prefix_cache: int | None = None,
             max_iteration_tokens: int = 512, max_active: int = 16) -> "MemoryBudget":
        """Split `total` (None: the machine's default) for `model`. `prefix_cache` None takes a quarter of
        what the weights leave. Raises ValueError when the weights and fixed shares leave no room for KV."""
        source = "configured"
        if total is None:
            total, source = machine_memory()
        weights = weight_bytes(model)
        shape = kv_shape(model, max_iteration_tokens) or KVShape(kv_token_bytes(model))
        activations = activation_bytes(text_args(model), max_iteration_tokens, max_active)
        buffer_cache = buffer_cache_bytes(total)
        free = total - weights - activations - buffer_cache
        if prefix_cache is None:
            prefix_cache = max(0, int(free * PREFIX_CACHE_SHARE))
        budget = cls(int(total), weights, int(prefix_cache), buffer_cache, activations, shape.token_bytes, source,
                     shape.state_bytes, shape.window_token_bytes, shape.window_bytes)
        if budget.kv < shape.token_bytes * 256 + shape.row_bytes:  # room for one row of 256 positions
            # ModelUnsupported, an EngineError: the server says it in these words, not as a config.json fault.
            raise ModelUnsupported(
                f"the memory budget of {total / MIB:,.0f} MiB leaves {budget.kv / MIB:,.0f} MiB for KV after the "
                f"weights ({weights / MIB:,.0f} MiB), the prefix cache ({prefix_cache / MIB:,.0f} MiB), MLX's "
                f"buffer cache and activations: raise --memory-budget"
                + (" or lower --prompt-cache-bytes" if prefix_cache else " (the prefix cache already takes none)"))
        return budget

    def as_dict(self) -> dict[str, Any]:
        """Plain data for /stats (`kv_row_bytes`: the most a row's windows and states hold). Raises nothing."""
        return {**asdict(self), "kv": self.kv, "kv_row_bytes": self.kv_shape.row_bytes}


def buffer_cache_bytes(total: int) -> int:
    """MLX's buffer cache's share of a budget of `total` bytes. Raises nothing."""
    return max(64 * MIB, int(total * BUFFER_CACHE_SHARE))


def activation_bytes(args: Any, tokens: int, rows: int) -> int:
    """One iteration's live intermediates (hidden, MLP, attention scores, logits) for a model of settings `args`
    (engine/model_args.py's text_args), with a generous factor. Raises nothing."""
    hidden = int(getattr(args, "hidden_size", 0) or 4096)
    inter = int(getattr(args, "intermediate_size", 0) or 4 * hidden)
    vocab = int(getattr(args, "vocab_size", 0) or 32000)
    per_token = 4 * (4 * hidden + 3 * inter)
    return int(2 * tokens * per_token + 4 * rows * vocab * 2 + 128 * MIB)


def configure_allocator(budget: MemoryBudget) -> None:
    """Bound MLX's cache of freed buffers and make glibc return large freed blocks to the OS. Call once, on
    the engine thread, before serving. Raises nothing."""
    import mlx.core as mx

    mx.set_cache_limit(budget.buffer_cache)
    libc = _libc()
    if libc is not None:
        # A fixed mmap threshold stops glibc from raising it after each large free (its default), which
        # otherwise moves KV-sized blocks onto the heap, where freed memory stays in the process.
        libc.mallopt(-3, 1 * MIB)  # M_MMAP_THRESHOLD


def release_free_memory() -> None:
    """Give cached and freed memory back (MLX's buffer cache, glibc's heap tops); call when idle on the
    engine thread. Raises nothing."""
    import mlx.core as mx

    mx.clear_cache()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def process_rss() -> int:
    """Resident bytes of this process (0 where /proc is missing). Raises nothing."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


_LIBC: Any = None


def _libc() -> Any:
    global _LIBC
    if _LIBC is None and sys.platform.startswith("linux"):
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC = lib if hasattr(lib, "mallopt") and hasattr(lib, "malloc_trim") else False
        except OSError:
            _LIBC = False
    return _LIBC or None


def size_text(n: int) -> str:
    """Bytes as a message shows them: MiB, or bytes below one. Raises nothing."""
    return f"{n:,} bytes" if n < MIB else f"{n / MIB:,.0f} MiB"
