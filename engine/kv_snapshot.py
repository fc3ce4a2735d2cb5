"""Snapshots of a row's per-layer KV caches for the prefix cache: a compact, materialized copy covering a
number of tokens, and fresh cache objects handed back from one (mlx-lm cache layouts)."""

from __future__ import annotations

import copy
from typing import Any, Iterator, Sequence

import mlx.core as mx
from mlx_lm.models.cache import CacheList, KVCache, QuantizedKVCache, RotatingKVCache

__all__ = ["COMPACTABLE", "arrays_of", "map_arrays", "snapshot_layer", "restore_layer", "trimmable_through"]

# Layer types whose arrays hold positions [0, offset) on axis 2 and which we can re-slice freely.
COMPACTABLE = (KVCache, QuantizedKVCache)


def arrays_of(obj: Any) -> Iterator[mx.array]:
    """Every mx.array inside obj (caches, lists, tuples, dicts). Raises nothing."""
    if isinstance(obj, mx.array):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from arrays_of(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from arrays_of(item)
    elif hasattr(obj, "__dict__"):
        for item in vars(obj).values():
            yield from arrays_of(item)


def map_arrays(obj: Any, fn: Any) -> Any:
    """A structural copy of obj (caches, lists, tuples, dicts) with every mx.array replaced by fn(a)."""
    if isinstance(obj, mx.array):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_arrays(item, fn) for item in obj)
    if isinstance(obj, dict):
        return {k: map_arrays(v, fn) for k, v in obj.items()}
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        clone = copy.copy(obj)
        for name, value in vars(obj).items():
            setattr(clone, name, map_arrays(value, fn))
        return clone
    return obj


def snapshot_layer(layer: Any, length: int) -> Any:
    """An independent, materialized copy of one layer's cache covering `length` tokens."""
    if isinstance(layer, COMPACTABLE) and layer.keys is not None:
        # mx.array(view) copies into a fresh buffer: the snapshot neither pins the row's
        # step-padded buffer nor blocks in-place KV updates of the live row.
        clone = copy.copy(layer)
        clone.keys, clone.values = map_arrays(
            (layer.keys, layer.values), lambda a: mx.array(a[..., :length, :])
        )
        clone.offset = length
        return clone
    if isinstance(layer, RotatingKVCache) and layer.keys is not None and layer.offset == length \
            and layer.keys.shape[2] > layer.max_size:
        return _window_copy(layer)
    clone = map_arrays(layer, mx.array)
    offset = getattr(clone, "offset", None)
    if isinstance(offset, int) and offset > length:
        clone.trim(offset - length)
    return clone


def _window_copy(layer: RotatingKVCache) -> RotatingKVCache:
    """A sliding layer after a prompt chunk holds its window plus the chunk, in temporal order; its next update keeps
    the window alone, and so does this copy (else an entry held a whole chunk past the window per sliding layer)."""
    keys, values = layer.keys, layer.values
    assert keys is not None and values is not None
    cut, keep = keys.shape[2] - layer.max_size, layer.keep
    window = copy.copy(layer)
    window.keys, window.values = (mx.concatenate([a[..., :keep, :], a[..., cut + keep:, :]], axis=2)
                                  for a in (keys, values))
    window._idx = layer.max_size
    return window


def restore_layer(layer: Any, stored_length: int, length: int) -> Any:
    """Fresh cache objects for the caller; shared buffers are copy-on-write in MLX."""
    if isinstance(layer, COMPACTABLE) and layer.keys is not None:
        clone = copy.copy(layer)
        # Slicing yields new array objects, so the caller's in-place updates never reach the entry.
        clone.keys, clone.values = map_arrays((layer.keys, layer.values), lambda a: a[..., :length, :])
        clone.offset = length
        return clone
    clone = map_arrays(layer, mx.array)
    if stored_length > length:
        clone.trim(stored_length - length)
    return clone


def trimmable_through(cache: Sequence[Any], positions: int) -> bool:
    """Whether every layer of a row's cache can still be cut back once it holds `positions` tokens, so that an entry
    of it serves any shorter prompt: a sliding window's ring until it wraps, a recurrent state (Mamba's, a linear
    attention's) never. Raises nothing of its own."""
    return all(_trimmable_through(layer, positions) for layer in cache)


def _trimmable_through(layer: Any, positions: int) -> bool:
    if isinstance(layer, RotatingKVCache):
        return positions < layer.max_size  # its own test, on the offset it will have
    if isinstance(layer, CacheList):
        return all(_trimmable_through(c, positions) for c in layer.caches)
    return bool(layer.is_trimmable())
