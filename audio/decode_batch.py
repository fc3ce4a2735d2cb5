"""Decode rows' attention in one batch: the rows of a forward that each feed their next sampled token share
stacked self-attention keys and values (one slot per row, the text context's capacity) and stacked
cross-attention keys and values, so a decoder layer's attention is a few batched ops whatever the row count.

Per-row attention launched ~16 kernels a row a layer: on an H200, 8 rows of a 4-layer turbo decoder cost the host
~6 ms a token while the device idled (16 live speakers fell behind). The math is mlx-whisper's qkv_attention,
with padded key positions masked to -inf (weight exactly 0); sums run over the padded length, so the bits may
differ from a row alone by rounding, as they already do on a GPU. Used by default on a GPU only: on a CPU the
per-row path is exact and its overhead small next to the math (`TANDEM_WHISPER_BATCH=on|off` overrides).
MLX is imported inside the functions (see audio/decoder.py)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import partial
from typing import Any

from engine.accelerator import gpu_default

__all__ = ["RowBatch", "batch_enabled", "batched_forward", "compile_enabled", "own_kv"]


def batch_enabled() -> bool:
    """Whether pure decode forwards of several rows use a RowBatch (TANDEM_WHISPER_BATCH=on|off, else on a GPU).
    Raises nothing."""
    return gpu_default("TANDEM_WHISPER_BATCH")


@dataclass(eq=False)
class RowBatch:
    """Stacked caches of `rows` (in this order): per layer, self keys/values (R, capacity, D) with row i's first
    `rows[i].fed` positions valid, and cross keys (R, H, D/H, C) / values (R, H, C, D/H) with `cross_mask`
    (R, 1, 1, C) hiding the positions past each row's own context."""

    rows: list[Any]
    keys: list[Any]
    values: list[Any]
    cross_keys: list[Any]
    cross_values: list[Any]
    cross_mask: Any

    @classmethod
    def build(cls, rows: list[Any], dec: Any) -> "RowBatch":
        """Stack the rows' caches (each row's own, or its slot of the batch it was in) in slots of decoder `dec`'s
        whole text context. Raises nothing."""
        import mlx.core as mx

        capacity = int(dec.positional_embedding.shape[0])
        layers = len(rows[0].cross_kv)
        own = [own_kv(r) for r in rows]
        keys, values = [], []
        for layer in range(layers):
            ks, vs = [], []
            for r, kv in zip(rows, own):
                k, v = kv[layer]
                pad = [(0, 0), (0, capacity - r.fed), (0, 0)]
                ks.append(mx.pad(k, pad))
                vs.append(mx.pad(v, pad))
            keys.append(mx.concatenate(ks, axis=0))
            values.append(mx.concatenate(vs, axis=0))
        contexts = [int(r.cross_kv[0][1].shape[2]) for r in rows]
        longest = max(contexts)
        cross_keys, cross_values = [], []
        for layer in range(layers):
            cks = [mx.pad(r.cross_kv[layer][0], [(0, 0), (0, 0), (0, 0), (0, longest - c)]) if c < longest
                   else r.cross_kv[layer][0] for r, c in zip(rows, contexts)]
            cvs = [mx.pad(r.cross_kv[layer][1], [(0, 0), (0, 0), (0, longest - c), (0, 0)]) if c < longest
                   else r.cross_kv[layer][1] for r, c in zip(rows, contexts)]
            cross_keys.append(mx.concatenate(cks, axis=0))
            cross_values.append(mx.concatenate(cvs, axis=0))
        # Always a mask (zeros where contexts agree: adding 0 changes no bit), so one traced graph serves all.
        mask = mx.where(mx.arange(longest)[None] < mx.array(contexts)[:, None], 0.0, -mx.inf)
        mask = mask.astype(cross_keys[0].dtype)[:, None, None, :]
        batch = cls(list(rows), keys, values, cross_keys, cross_values, mask)
        mx.eval(batch.keys, batch.values, batch.cross_keys, batch.cross_values, mask)
        for i, r in enumerate(rows):
            r.kv = [None] * layers
            r.batch = (batch, i)
        return batch

    def serves(self, rows: list[Any]) -> bool:
        """Whether a forward of `rows` can run over this batch: each is in it, and every member still only has
        its last token to feed and none finished (members outside `rows` are computed too and not advanced:
        their slot is written again, the same way, when their turn comes; paced steps take the rows in turns).
        Raises nothing."""
        if not all(r.batch is not None and r.batch[0] is self for r in rows):
            return False
        return all(m.batch is not None and m.batch[0] is self and not m.done and m.feeds_last_token
                   for m in self.rows)

    def logits(self, dec: Any) -> Any:
        """Decoder `dec` over every member's one unfed token (at its position `fed`): writes the new keys/values
        into the members' slots and returns float32 logits (R, vocabulary), in member order. The caller advances
        `fed` of the rows it samples. Raises what MLX raises."""
        import mlx.core as mx

        tokens = mx.array([r.context[r.fed] for r in self.rows])  # one copy to the device, not a slice a row
        at = mx.array([r.fed for r in self.rows])
        forward = _compiled(dec) if compile_enabled() else partial(batched_forward, dec)
        logits, self.keys, self.values = forward(tokens, at, self.keys, self.values, self.cross_keys,
                                                 self.cross_values, self.cross_mask)
        return logits


def batched_forward(dec: Any, tokens: Any, at: Any, keys: list[Any],
                    values: list[Any], cross_keys: list[Any], cross_values: list[Any],
                    cross_mask: Any) -> tuple[Any, list[Any], list[Any]]:
    """The decoder over R rows' one token each (`tokens` (R,) at positions `at` (R,)), attending over stacked
    slots: returns float32 logits (R, vocabulary) and the slots with the new keys/values written. A pure function
    of its arrays (the rows are a matrix's rows, heads split and joined along their own axes), so mx.compile can
    trace it: once per row count and context length. Raises what MLX raises."""
    import mlx.core as mx
    import mlx.nn as nn

    capacity = int(keys[0].shape[1])
    # Keys past a row's position are zeros of an empty slot or stale: -inf gives them weight exactly 0.
    position = mx.expand_dims(mx.arange(capacity), 0)
    mask = mx.where(position <= mx.expand_dims(at, 1), 0.0, -mx.inf)
    mask = mx.expand_dims(mask.astype(dec._mask.dtype), (1, 2))  # added as the decoder's own causal mask is
    here = mx.expand_dims(position == mx.expand_dims(at, 1), 2)  # (R, capacity, 1): where each row writes
    x = dec.token_embedding(tokens) + dec.positional_embedding[at]  # (R, D): rows as a matrix's rows
    keys, values = list(keys), list(values)
    for layer, block in enumerate(dec.blocks):
        attn = block.attn
        head = attn.n_head
        scale = (int(x.shape[-1]) // head) ** -0.25
        h = block.attn_ln(x)
        q, k, v = attn.query(h), attn.key(h), attn.value(h)  # (R, D) each
        # Written by a select over the slot (the variant measured on the H200; the same bits as a scatter).
        keys[layer] = mx.where(here, mx.expand_dims(k, 1), keys[layer])
        values[layer] = mx.where(here, mx.expand_dims(v, 1), values[layer])
        qh = _heads(mx.expand_dims(q, 1), head) * scale  # (R, H, 1, D/H)
        kh = _heads(keys[layer], head).swapaxes(2, 3) * scale  # (R, H, D/H, capacity)
        w = mx.softmax(qh @ kh + mask, axis=-1, precise=True)
        x = x + attn.out(_joined(w @ _heads(values[layer], head)))
        cross = block.cross_attn
        qc = _heads(mx.expand_dims(cross.query(block.cross_attn_ln(x)), 1), head) * scale
        w = mx.softmax(qc @ cross_keys[layer] + cross_mask, axis=-1, precise=True)
        x = x + cross.out(_joined(w @ cross_values[layer]))
        x = x + block.mlp2(nn.gelu(block.mlp1(block.mlp_ln(x))))
    x = dec.ln(x)
    return dec.token_embedding.as_linear(x).astype(mx.float32), keys, values


def _heads(x: Any, head: int) -> Any:
    """(R, T, D) as (R, H, T, D/H). Raises nothing."""
    import mlx.core as mx

    return mx.unflatten(x, -1, (head, -1)).swapaxes(1, 2)


def _joined(x: Any) -> Any:
    """(R, H, 1, D/H) as (R, D): the heads joined again. Raises nothing."""
    import mlx.core as mx

    return mx.flatten(x, 1, 3)


def compile_enabled() -> bool:
    """Whether batched forwards run mx.compile'd (TANDEM_WHISPER_COMPILE=on|off, else on a GPU): replaying a
    traced graph skips building ~150 ops in Python each token and fuses the elementwise ones. Raises nothing."""
    return gpu_default("TANDEM_WHISPER_COMPILE")


def _compiled(dec: Any) -> Any:
    """Decoder `dec`'s batched_forward, mx.compile'd (traced again per row count and context length; a shapeless
    trace crashed MLX's CPU backend), made on first use and kept on the decoder. It holds the decoder weakly, so
    the traced graphs, which hold its weights, go when the model is unloaded. Raises nothing."""
    import mlx.core as mx

    held = dec.__dict__.get("_tandem_compiled")
    if held is None:
        ref = weakref.ref(dec)
        held = mx.compile(lambda *args: batched_forward(ref(), *args))
        object.__setattr__(dec, "_tandem_compiled", held)
    return held


def own_kv(row: Any) -> list[Any]:
    """Row's self-attention keys/values per layer, each (1, fed, D): its own, or its slot of its batch (the row
    then leaves the batch). Raises nothing."""
    placed = row.batch
    if placed is None:
        return list(row.kv)
    batch, i = placed
    row.kv = [(k[i:i + 1, :row.fed], v[i:i + 1, :row.fed]) for k, v in zip(batch.keys, batch.values)]
    row.batch = None
    return list(row.kv)
