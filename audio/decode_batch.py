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

from dataclasses import dataclass
from typing import Any

from engine.accelerator import gpu_default

__all__ = ["RowBatch", "batch_enabled", "own_kv"]


def batch_enabled() -> bool:
    """Whether pure decode forwards of several rows use a RowBatch (TANDEM_WHISPER_BATCH=on|off, else on a GPU).
    Raises nothing."""
    return gpu_default("TANDEM_WHISPER_BATCH")


@dataclass(eq=False)
class RowBatch:
    """Stacked caches of `rows` (in this order): per layer, self keys/values (R, capacity, D) with row i's first
    `rows[i].fed` positions valid, and cross keys (R, H, D/H, C) / values (R, H, C, D/H) with `cross_mask`
    (R, 1, 1, C; None when every row has the same C) hiding the positions past each row's own context."""

    rows: list[Any]
    mask_dtype: Any  # the decoder's own causal mask's dtype: its additive masks add the same way
    keys: list[Any]
    values: list[Any]
    cross_keys: list[Any]
    cross_values: list[Any]
    cross_mask: Any

    @classmethod
    def build(cls, rows: list[Any], capacity: int, mask_dtype: Any) -> "RowBatch":
        """Stack the rows' caches (each row's own, or its slot of the batch it was in). Raises nothing."""
        import mlx.core as mx

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
        mask = None
        if min(contexts) < longest:
            mask = mx.where(mx.arange(longest)[None] < mx.array(contexts)[:, None], 0.0, -mx.inf)
            mask = mask.astype(cross_keys[0].dtype)[:, None, None, :]
        batch = cls(list(rows), mask_dtype, keys, values, cross_keys, cross_values, mask)
        mx.eval(batch.keys, batch.values, batch.cross_keys, batch.cross_values, *([mask] if mask is not None else []))
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

        tokens = mx.concatenate([r.tokens[:, r.fed:r.fed + 1] for r in self.rows], axis=1)
        x = dec.token_embedding(tokens) + dec.positional_embedding[mx.array([r.fed for r in self.rows])]
        x = dec.ln(self._layers(dec, x))
        return dec.token_embedding.as_linear(x).astype(mx.float32)[0]

    def _layers(self, dec: Any, x: Any) -> Any:
        import mlx.core as mx
        import mlx.nn as nn

        n = len(self.rows)
        capacity = int(self.keys[0].shape[1])
        at = mx.array([r.fed for r in self.rows])
        slots = mx.arange(n)
        # Keys past a row's position are zeros of an empty slot or stale: -inf gives them weight exactly 0.
        mask = mx.where(mx.arange(capacity)[None] <= at[:, None], 0.0, -mx.inf).astype(self.mask_dtype)[:, None, None, :]
        for layer, block in enumerate(dec.blocks):
            attn = block.attn
            head = attn.n_head
            width = x.shape[-1]
            scale = (width // head) ** -0.25
            h = block.attn_ln(x)
            q, k, v = attn.query(h)[0], attn.key(h)[0], attn.value(h)[0]  # (R, D) each
            keys = self.keys[layer]
            values = self.values[layer]
            keys[slots, at] = k
            values[slots, at] = v
            self.keys[layer], self.values[layer] = keys, values
            qh = q.reshape(n, 1, head, -1).transpose(0, 2, 1, 3) * scale
            kh = keys.reshape(n, capacity, head, -1).transpose(0, 2, 3, 1) * scale
            vh = values.reshape(n, capacity, head, -1).transpose(0, 2, 1, 3)
            w = mx.softmax(qh @ kh + mask, axis=-1, precise=True)
            out = (w @ vh).transpose(0, 2, 1, 3).reshape(1, n, width)
            x = x + attn.out(out)
            cross = block.cross_attn
            qc = cross.query(block.cross_attn_ln(x))[0].reshape(n, 1, head, -1).transpose(0, 2, 1, 3) * scale
            logits = qc @ self.cross_keys[layer]
            if self.cross_mask is not None:
                logits = logits + self.cross_mask
            w = mx.softmax(logits, axis=-1, precise=True)
            out = (w @ self.cross_values[layer]).transpose(0, 2, 1, 3).reshape(1, n, width)
            x = x + cross.out(out)
            x = x + block.mlp2(nn.gelu(block.mlp1(block.mlp_ln(x))))
        return x


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
