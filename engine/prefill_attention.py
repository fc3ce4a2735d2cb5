"""A prompt chunk's attention as one strided batch per layer, where MLX's own would take pointer-array batches.

Without a fused prefill kernel (CUDA without cuDNN, the serving default: engine/accelerator.py) MLX's attention
fallback splits q into (kv heads, group) and broadcasts k and v over the group: a batch whose strides differ, which
its CUDA matmul runs from arrays of pointers built on the host for every product (20 % of the prefill lane's launch on
the H200, twenty-third session). Here the group's queries stand one after another in one matrix per kv head, (kv
heads, group × tokens, dim), so both products are strided batches over the kv heads, and the causal mask (tiled over
the group) is built once per forward instead of in every layer. Same math as the fallback: scores in the inputs'
dtype, a precise softmax. `TANDEM_PREFILL_ATTENTION` = grouped | sdpa (default sdpa: MLX's)."""

from __future__ import annotations

import os

import mlx.core as mx

__all__ = ["grouped_attention", "grouped_causal_mask", "grouped_enabled"]


def grouped_enabled() -> bool:
    """Whether prompt chunks attend through grouped_attention (TANDEM_PREFILL_ATTENTION=grouped). Raises nothing."""
    return os.environ.get("TANDEM_PREFILL_ATTENTION", "sdpa").lower() == "grouped"


def grouped_causal_mask(tokens: int, keys: int, groups: int) -> mx.array:
    """(groups × tokens, keys) bool: row g·tokens + i is query i, at position keys − tokens + i, which sees keys
    0..keys − tokens + i (mask="causal" for each of the group's heads). Raises nothing."""
    offset = keys - tokens
    causal = mx.arange(offset, keys)[:, None] >= mx.arange(keys)[None]
    return mx.tile(causal, (groups, 1)) if groups > 1 else causal


def grouped_attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array) -> mx.array:
    """softmax(q kᵀ · scale, masked) v for q (B, heads, T, D) and k, v (B, kv heads, S, D), heads a multiple of kv
    heads; `mask` from grouped_causal_mask(T, S, heads // kv heads). Returns (B, heads, T, D). Raises what MLX
    raises for shapes that do not fit."""
    b, heads, t, d = q.shape
    kv = k.shape[1]
    g = heads // kv
    qg = (q * mx.array(scale, q.dtype)).reshape(b, kv, g * t, d)
    scores = qg @ k.swapaxes(-1, -2)
    scores = mx.where(mask, scores, mx.array(mx.finfo(scores.dtype).min, scores.dtype))
    out = mx.softmax(scores, axis=-1, precise=True) @ v
    return out.reshape(b, heads, t, d)
