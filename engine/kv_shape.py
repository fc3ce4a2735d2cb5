"""KVShape — what one row's KV caches hold as it grows, read from the caches the model itself makes (mlx-lm's
`make_prompt_cache`): layers that keep every token's keys and values (full attention: KVCache, QuantizedKVCache),
sliding-window layers, bounded by their window (RotatingKVCache), and fixed states a row holds whatever its length (a
linear-attention or Mamba layer's: ArraysCache). A layer that owns no cache (Gemma 4's KV-shared ones) holds nothing.

Qwen3.5 keeps three Gated DeltaNet layers per full-attention one, gpt-oss alternates windows of 128 with full layers,
Gemma 3 has five windows per global layer: charging every layer per token reserved two to five times what they hold.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

__all__ = ["KVShape", "kv_shape", "GROWTH_STEP"]

_log = logging.getLogger(__name__)

GROWTH_STEP = 256  # mlx-lm's caches grow in steps of this many positions


@dataclass(frozen=True)
class KVShape:
    """A row's KV bytes by how they grow (see module doc)."""

    token_bytes: int  # a token's keys and values in the layers that keep every token
    state_bytes: int = 0  # the fixed states of a row, whatever its length
    window_token_bytes: int = 0  # a token's keys and values in the sliding-window layers, until their windows fill
    window_bytes: int = 0  # the sliding-window layers full: each window plus the prompt chunk written into it

    @property
    def row_bytes(self) -> int:
        """The most a row holds in its bounded layers (states and full windows), whatever its length."""
        return self.state_bytes + self.window_bytes

    def bounded_bytes(self, positions: int) -> int:
        """An upper bound of what a row of `positions` positions holds in its bounded layers: a window grows a step
        at a time (it may be a step past the row's length), up to its full size. Raises nothing."""
        return self.state_bytes + min(self.window_bytes, self.window_token_bytes * (positions + GROWTH_STEP))


def kv_shape(model: Any, chunk: int) -> KVShape | None:
    """The shape of `model`'s per-row caches, `chunk` being the most prompt tokens one forward writes (a sliding
    window briefly holds the window plus the chunk). None when every cache is mlx-lm's KVCache (every layer keeps
    every token: engine/memory.py's `kv_token_bytes` sizes those, as ever) or the caches cannot be read. Raises
    nothing."""
    from mlx_lm.models.cache import KVCache, make_prompt_cache

    try:
        caches = make_prompt_cache(model)
        if all(type(c) is KVCache for c in caches):
            return None
        _probe(model, caches)
        parts = [_layer(c, chunk) for c in caches]
    except Exception:  # noqa: BLE001 — a model the probe cannot run: the caller charges every layer per token
        _log.debug("could not read the model's KV caches", exc_info=True)
        return None
    if any(p is None for p in parts):
        return None
    return KVShape(*(sum(p[i] for p in parts if p is not None) for i in range(4)))


def _probe(model: Any, caches: list[Any]) -> None:
    """Feed one token through `model` into `caches`, lazily: nothing is evaluated, the caches' arrays only get their
    shapes. A forward may keep arrays on its modules, made on this thread and so unusable on the engine's (MLX streams
    are per thread): every module is left as it was."""
    import mlx.core as mx

    saved = [(m, dict(m), dict(vars(m))) for m in model.modules()]
    try:
        model(mx.array([[0]]), cache=caches)
    finally:
        for module, items, attrs in saved:  # dict's own methods: nn.Module.update sets parameters
            dict.clear(module)
            dict.update(module, items)
            vars(module).clear()
            vars(module).update(attrs)


def _layer(cache: Any, chunk: int) -> tuple[int, int, int, int] | None:
    """(token, state, window token, window) bytes of one probed cache; None for a kind not known here."""
    from mlx_lm.models.cache import ArraysCache, CacheList, RotatingKVCache

    if isinstance(cache, CacheList):
        parts = [_layer(c, chunk) for c in cache.caches]
        return None if any(p is None for p in parts) else \
            tuple(sum(p[i] for p in parts if p is not None) for i in range(4))  # type: ignore[return-value]
    if isinstance(cache, ArraysCache):
        return 0, int(cache.nbytes), 0, 0
    keys = getattr(cache, "keys", None)
    first = keys[0] if isinstance(keys, (tuple, list)) else keys  # a quantized cache's (data, scales, biases)
    positions = int(first.shape[-2]) if first is not None and first.ndim == 4 else 0
    if not positions:
        return None  # the probe left it empty, or keys of another layout: nothing known to size it by
    token = -(-int(cache.nbytes) // positions)
    if isinstance(cache, RotatingKVCache):
        return 0, 0, token, token * (int(cache.max_size) + chunk)
    return token, 0, 0, 0  # KVCache, QuantizedKVCache, and any other that keeps its positions on that axis
