"""Slot KV: every decoding row's KV in one buffer per layer, so decode attention is one call per layer.

Each layer holds keys and values as one (slots, kv_heads, capacity, head_dim) array, grown in steps.
A row owns one slot from the moment its prompt is complete until it finishes. One decode iteration
writes every row's new token with one scatter per array and runs one `scaled_dot_product_attention`
over (slots, heads, 1, head_dim) queries, with a boolean mask hiding positions at or beyond each row's
length; so the op count per layer is independent of the number of rows. On CUDA the attention is
engine/decode_attention.py's kernel instead: it takes each row's own slot and length (no mask, no gather).
Prompt chunks keep per-row mlx-lm `KVCache`s (`adopt` copies them into a slot), and `export` hands a slot
back as per-row `KVCache`s for the prefix cache. Freed slots keep their room until the group `compact`s
the buffers (when they hold twice what the remaining rows need) or every slot is free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import mlx.core as mx

from engine import decode_attention

__all__ = ["SlotKV", "DecodeBatch"]


@dataclass
class DecodeBatch:
    """Index arrays for one iteration's decode rows (built once, shared by every layer)."""

    rows: int  # B decode rows, in the order their tokens sit in the packed matrix
    span: int  # slots 0..span-1 take part in attention
    length: int  # key positions attended (max row length after this token)
    # Where each row's new key and value go, indexed (row, kv head) by broadcasting: k and v are written from
    # (B, H, head_dim) views of the projection, no copy.
    scatter_slot: mx.array  # (B, 1) each row's slot
    scatter_head: mx.array  # (1, H) the kv heads
    scatter_pos: mx.array  # (B, 1) each row's position (its length before this token)
    mask: mx.array | None  # (span, 1, 1, length) bool: True where a slot's position holds a key
    query_take: mx.array | None  # slot → decode row (None when slots 0..B-1 are the rows in order)
    out_take: mx.array | None  # decode row → slot
    offsets: mx.array  # (B,) RoPE offset of each row's token
    first_offset: int
    row_slots: mx.array | None = None  # (B,) int32 slot of each row: set when the decode kernel attends
    row_lengths: mx.array | None = None  # (B,) int32 keys each row attends (its length after this token)
    padded: int = 0  # of the B rows, the last `padded` stand in free slots (`plan(pad=True)`): outputs to drop


class SlotKV:
    """Slot-based KV storage for a llama-family model's decode rows (see module doc)."""

    def __init__(self, n_layers: int, step: int = 256, heads_per_kv: int = 1) -> None:
        self.n_layers = n_layers
        self.step = step
        self.heads_per_kv = heads_per_kv  # query heads sharing one kv head (the decode kernel's shape)
        self._kernel: bool | None = None  # whether decode_attention serves these buffers (decided once)
        # The most positions any row may reach (its prompt + max_tokens): growth never goes past it.
        self.ceiling: int | None = None
        self.reset()

    def reset(self) -> None:
        """Drop every slot and buffer. Raises nothing."""
        self.keys: list[mx.array] = []
        self.values: list[mx.array] = []
        self.lengths: dict[int, int] = {}
        self.slots = 0
        self.capacity = 0
        self.heads = 0
        self.head_dim = 0

    @property
    def nbytes(self) -> int:
        """Bytes allocated for every slot's buffers."""
        return sum(a.nbytes for a in self.keys + self.values)

    def token_nbytes(self) -> int:
        """Bytes one position of one slot takes across all layers (0 before the first adopt)."""
        return sum(a.nbytes for a in self.keys + self.values) // (self.slots * self.capacity) if self.slots and self.capacity else 0

    @property
    def used_nbytes(self) -> int:
        """The occupied slots' share of `nbytes` (freed slots keep their room until the buffers drop)."""
        return self.nbytes * len(self.lengths) // self.slots if self.slots else 0

    def length(self, slot: int) -> int:
        """Tokens held by `slot`. Raises KeyError for a free slot."""
        return self.lengths[slot]

    def _grow(self, slots: int, capacity: int) -> None:
        slots = max(slots, self.slots)
        capacity = max(capacity, self.capacity)
        if slots == self.slots and capacity == self.capacity:
            return
        if capacity > self.capacity:
            # Grow by a quarter at least (fewer whole-buffer copies), never past what the rows reserved.
            capacity = max(capacity, min(self.capacity + self.capacity // 4, self.ceiling or capacity))
        capacity = -(-capacity // self.step) * self.step
        slots = _pow2(slots)  # joins rarely regrow; at most twice the rows' slots
        h, d = self.heads, self.head_dim
        for arrays in (self.keys, self.values):
            for i, a in enumerate(arrays):
                if capacity > self.capacity:
                    a = mx.concatenate([a, mx.zeros((a.shape[0], h, capacity - self.capacity, d), a.dtype)], axis=2)
                if slots > self.slots:
                    a = mx.concatenate([a, mx.zeros((slots - self.slots, h, capacity, d), a.dtype)], axis=0)
                arrays[i] = a
        self.slots, self.capacity = slots, capacity

    def oversized(self) -> bool:
        """Whether the buffers hold at least twice the slots or the positions the rows need. Raises nothing."""
        if not self.lengths:
            return False
        need = -(-(max(self.lengths.values()) + 1) // self.step) * self.step
        return _pow2(len(self.lengths)) < self.slots or 2 * need <= self.capacity

    def compact(self) -> dict[int, int]:
        """Move the occupied slots to 0..n-1 in fresh buffers sized for them (slots: the next power of two;
        positions: the longest row's, step-rounded), so memory follows the rows that are left. Returns
        {old slot: new slot} for the slots that moved. Raises nothing."""
        if not self.lengths:
            self.reset()
            return {}
        order = sorted(self.lengths)
        need = -(-(max(self.lengths.values()) + 1) // self.step) * self.step
        slots, capacity = _pow2(len(order)), min(self.capacity, need)
        index = mx.array(order)
        h, d = self.heads, self.head_dim
        for arrays in (self.keys, self.values):
            for i, a in enumerate(arrays):
                kept = mx.take(a[:, :, :capacity], index, axis=0)
                pad = [mx.zeros((slots - len(order), h, capacity, d), a.dtype)] if slots > len(order) else []
                arrays[i] = mx.concatenate([kept, *pad], axis=0) if pad else kept
        moved = {old: new for new, old in enumerate(order) if old != new}
        self.lengths = {new: self.lengths[old] for new, old in enumerate(order)}
        self.slots, self.capacity = slots, capacity
        return moved

    def adopt(self, caches: Sequence[Any]) -> int:
        """Copy one row's per-layer `KVCache`s (offset n) into a free slot; returns the slot.
        Raises ValueError if the list does not match the model's layers or the caches are empty."""
        if len(caches) != self.n_layers or caches[0].keys is None:
            raise ValueError("adopt needs one filled KVCache per layer")
        n = caches[0].offset
        _, h, _, d = caches[0].keys.shape
        if not self.keys:
            dtype = caches[0].keys.dtype
            self.heads, self.head_dim = h, d
            self.keys = [mx.zeros((0, h, 0, d), dtype) for _ in range(self.n_layers)]
            self.values = [mx.zeros((0, h, 0, d), dtype) for _ in range(self.n_layers)]
        slot = next(s for s in range(self.slots + 1) if s not in self.lengths)
        self._grow(slot + 1, n + 1)
        for li, c in enumerate(caches):
            self.keys[li][slot : slot + 1, :, :n] = c.keys[..., :n, :]
            self.values[li][slot : slot + 1, :, :n] = c.values[..., :n, :]
        self.lengths[slot] = n
        return slot

    def release(self, slot: int | None) -> None:
        """Free a slot (its stale KV stays masked until reused); drops the buffers when none is left.
        Raises nothing."""
        if slot is not None:
            self.lengths.pop(slot, None)
        if not self.lengths:
            self.reset()

    def export(self, slot: int, length: int | None = None) -> list[Any]:
        """The slot's first `length` (default: all) positions as fresh per-layer mlx-lm `KVCache`s (lazy
        views: snapshot before the next write). Raises KeyError for a free slot."""
        from mlx_lm.models.cache import KVCache

        n = self.lengths[slot] if length is None else min(length, self.lengths[slot])
        out = []
        for k, v in zip(self.keys, self.values):
            c = KVCache()
            c.keys = k[slot : slot + 1, :, :n]
            c.values = v[slot : slot + 1, :, :n]
            c.offset = n
            out.append(c)
        return out

    def plan(self, slots: Sequence[int], pad: bool = False) -> DecodeBatch:
        """Prepare one decode token for each slot in `slots` (grows capacity). `pad`: when `slots` are every held
        slot, rows in the free slots (token 0 at position 0, attending only it) fill the batch to all the buffers'
        slots, so rows joining and leaving keep a compiled step's shape (engine/compiled_decode.py). Raises
        KeyError for a free slot."""
        lens = [self.lengths[s] for s in slots]
        length = max(lens) + 1
        self._grow(self.slots, length)
        padded = 0
        if pad and len(slots) == len(self.lengths) < self.slots:
            free = [s for s in range(self.slots) if s not in self.lengths]
            slots, lens, padded = [*slots, *free], lens + [0] * len(free), len(free)
        span = max(slots) + 1
        h = self.heads
        offsets = mx.array(lens)
        batch = DecodeBatch(
            rows=len(slots), span=span, length=length,
            scatter_slot=mx.array(list(slots))[:, None], scatter_head=mx.arange(h)[None],
            scatter_pos=offsets[:, None], mask=None, query_take=None, out_take=None,  # one slot: all valid
            offsets=offsets, first_offset=lens[0], padded=padded,
        )
        if span == 1:
            return batch
        if self.uses_kernel() or padded:  # each row's slot and length: no mask, rows stay in their order
            batch.row_slots = mx.array(list(slots), dtype=mx.int32)
            batch.row_lengths = mx.array([n + 1 for n in lens], dtype=mx.int32)
            return batch
        slot_len = [1] * span  # slots not decoding now: keep one key so softmax stays finite
        for s, n in zip(slots, lens):
            slot_len[s] = n + 1
        batch.mask = (mx.arange(length)[None] < mx.array(slot_len)[:, None])[:, None, None, :]
        if list(slots) != list(range(span)):
            row_of = [0] * span
            for i, s in enumerate(slots):
                row_of[s] = i
            batch.query_take, batch.out_take = mx.array(row_of), mx.array(list(slots))
        return batch

    def attend(self, li: int, q: mx.array, k: mx.array, v: mx.array, scale: float, batch: DecodeBatch) -> mx.array:
        """Write k/v (B, kv_heads, 1, d) into layer `li` and attend with q (B, heads, 1, d) → (B, heads, 1, d).
        Raises nothing of its own."""
        at = (batch.scatter_slot, batch.scatter_head, batch.scatter_pos)
        self.keys[li][at] = k[:, :, 0]
        self.values[li][at] = v[:, :, 0]
        if batch.row_slots is not None and batch.row_lengths is not None:
            return decode_attention.attend(q, self.keys[li], self.values[li], batch.row_slots, batch.row_lengths, scale)
        keys = self.keys[li][: batch.span, :, : batch.length]
        values = self.values[li][: batch.span, :, : batch.length]
        if batch.query_take is not None:
            q = q[batch.query_take]
        o = mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask=batch.mask)
        return o[batch.out_take] if batch.out_take is not None else o

    def uses_kernel(self) -> bool:
        """Whether decode attention runs engine/decode_attention.py's kernel on these buffers (decided once, after
        the first adopt). Raises nothing."""
        if self._kernel is None:
            self._kernel = decode_attention.available(self.keys[0].dtype, self.head_dim, self.heads_per_kv)
        return self._kernel

    def commit(self, slots: Sequence[int]) -> None:
        """Count the token each slot just wrote. Raises KeyError for a free slot."""
        for s in slots:
            self.lengths[s] += 1


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
