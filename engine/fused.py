"""Fused projections: q/k/v as one matmul and an MLP's gate/up as one, over the same weight memory.

Each linear layer costs a kernel launch and, on the host, a graph node per iteration; at decode sizes that
fixed cost is a large share of a step. The fused weight is one concatenated buffer and the original
layers' weights become views into it, so memory is not doubled and mlx-lm's own forward still works.
Layers that cannot be fused (mixed kinds, mixed quantization) keep one call each.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import mlx.core as mx
import mlx.nn as nn

__all__ = ["FusedLinear", "fused_mlp", "heads", "projected_heads", "rope_rows"]


def _quant_key(layer: nn.Module) -> tuple[Any, ...] | None:
    if isinstance(layer, nn.QuantizedLinear):
        return ("q", layer.group_size, layer.bits, getattr(layer, "mode", "affine"), "biases" in layer, "bias" in layer)
    if type(layer) is nn.Linear:
        return ("f", "bias" in layer)
    return None


class FusedLinear:
    """Same-input linear layers as one matmul; `__call__` returns each layer's output in order."""

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        """Fuses when every layer is a plain or identically quantized Linear; otherwise calls each.
        Raises nothing."""
        self.layers = list(layers)
        keys = {_quant_key(layer) for layer in self.layers}
        self.fused = len(self.layers) > 1 and len(keys) == 1 and None not in keys
        if not self.fused:
            return
        first = self.layers[0]
        self.quantized = isinstance(first, nn.QuantizedLinear)
        names = [n for n in ("weight", "scales", "biases", "bias") if n in first]
        joined = {n: mx.concatenate([layer[n] for layer in self.layers], axis=0) for n in names}
        mx.eval(list(joined.values()))  # evaluated here, so any thread may run it (MLX streams are per thread)
        self.splits: list[int] = []
        start = 0
        for layer in self.layers:
            rows = layer["weight"].shape[0]
            for n in names:  # the layer now reads a view of the fused buffer
                layer[n] = joined[n][start : start + rows]
            start += rows
            self.splits.append(start)
        self.splits.pop()
        self.params = joined
        if self.quantized:
            self.group_size, self.bits, self.mode = first.group_size, first.bits, getattr(first, "mode", "affine")

    def __call__(self, x: mx.array) -> list[mx.array]:
        if not self.fused:
            return [layer(x) for layer in self.layers]
        return list(mx.split(self.project(x), self.splits, axis=-1))

    def project(self, x: mx.array) -> mx.array:
        """The fused layers' outputs side by side on the last axis, one matmul (only when `fused`). Raises what
        MLX raises."""
        p = self.params
        if self.quantized:
            y = mx.quantized_matmul(x, p["weight"], scales=p["scales"], biases=p.get("biases"), transpose=True,
                                    group_size=self.group_size, bits=self.bits, mode=self.mode)
            if "bias" in p:
                y = y + p["bias"]
        elif "bias" in p:
            y = mx.addmm(p["bias"], x, p["weight"].T)
        else:
            y = x @ p["weight"].T
        return y


def fused_mlp(mlp: nn.Module) -> Callable[[mx.array], mx.array]:
    """The MLP as `down(silu(gate(x)) * up(x))` with gate and up fused, for mlx-lm's llama-family MLP
    classes; any other MLP is returned as it is. Raises nothing."""
    from mlx_lm.models import llama, qwen2, qwen3
    from mlx_lm.models.activations import swiglu

    if type(mlp) not in (llama.MLP, qwen2.MLP, qwen3.MLP):
        return mlp
    gate_up = FusedLinear([mlp.gate_proj, mlp.up_proj])
    down = mlp.down_proj

    def forward(x: mx.array) -> mx.array:
        gate, up = gate_up(x)
        return down(swiglu(gate, up))

    forward.gate_up, forward.down = gate_up, down  # type: ignore[attr-defined]  # for kernels that fold the MLP in
    return forward


def heads(attn: Any, proj: FusedLinear, x: mx.array, rows: int, offset: mx.array | int | None) -> list[mx.array]:
    """q, k, v of mlx-lm attention module `attn` as (rows, heads, 1, head_dim) for one token a row, q and k rotated
    by RoPE at `offset` (one per row, or one for all; None: not rotated). With a fused projection they are views of
    it (`projected_heads`). Lazy. Raises what MLX raises."""
    nh, nkv = attn.n_heads, attn.n_kv_heads
    if proj.fused and not hasattr(attn, "q_norm"):
        return projected_heads(attn, proj.project(x), rows, offset)
    q, k, v = (a.reshape(rows, n, 1, -1) for a, n in zip(proj(x), (nh, nkv, nkv)))
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    if offset is None:
        return [q, k, v]
    return [rope_rows(attn.rope, q, offset), rope_rows(attn.rope, k, offset), v]


def projected_heads(attn: Any, y: mx.array, rows: int, offset: mx.array | int | None) -> list[mx.array]:
    """q, k, v as `heads` gives them, as views of `y`, the fused q/k/v projection of one token a row; one RoPE call
    rotates q's and k's heads (same rows, same offsets): a decode step is bound by its launches on a GPU, and on a
    CPU RoPE is a dozen ops. Lazy. Raises what MLX raises."""
    nh, nkv = attn.n_heads, attn.n_kv_heads
    y = y.reshape(rows, nh + 2 * nkv, 1, -1)
    qk = y[:, : nh + nkv] if offset is None else rope_rows(attn.rope, y[:, : nh + nkv], offset)
    return [qk[:, :nh], qk[:, nh:], y[:, nh + nkv :]]


# MLX's CUDA RoPE over (rows, heads, 1, head_dim) launches (head_dim / 2, 1, rows x ceil(heads / 4)) threads as one
# block shape; at head_dim 16 and 32+ rows of 6 heads the block's z passes CUDA's 64 and no kernel launches
# ("invalid argument", mlx 0.32.4, whatever the offsets). Rows in groups that keep z within 64; others in one call.
_ROPE_Z_LIMIT = 64


def rope_rows(rope: Any, x: mx.array, offset: mx.array | int) -> mx.array:
    """`rope(x, offset=offset)` for x (rows, heads, 1, head_dim) with one offset a row (or one for all), in row
    groups where the whole call would not launch on CUDA (comment above). Lazy. Raises what MLX raises."""
    rows, n_heads, head_dim = x.shape[0], x.shape[1], x.shape[-1]
    group = max(1, _ROPE_Z_LIMIT // -(-n_heads // 4))
    if head_dim > 16 or rows <= group:
        return rope(x, offset=offset)
    if isinstance(offset, mx.array) and offset.ndim > 0:
        return mx.concatenate([rope(x[i:i + group], offset=offset[i:i + group]) for i in range(0, rows, group)])
    return mx.concatenate([rope(x[i:i + group], offset=offset) for i in range(0, rows, group)])
