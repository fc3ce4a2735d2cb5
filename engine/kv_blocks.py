"""Shared KV blocks under the prefix cache's entries: entries of one namespace that share a token prefix share that
prefix's keys and values (causal attention: a position's K/V depend only on the tokens up to it).

Layers that keep every position on axis -2 (mlx-lm's KVCache, QuantizedKVCache) are stored in blocks of
`block_tokens` positions aligned to absolute positions, in a trie keyed by each block's tokens, so a block stands for
the whole token prefix up to its end. An entry refers to the blocks its tokens fill and keeps the positions past its
last whole block (its tail) as its own; a put copies only the blocks not held yet, and a block goes when the last
entry referring to it does. Other layers (sliding windows, recurrent states, CacheList) keep a whole snapshot per entry.
Engine threads only, under the prefix cache's lock.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Sequence

import mlx.core as mx

from engine.kv_snapshot import COMPACTABLE, arrays_of, map_arrays, restore_layer, snapshot_layer

__all__ = ["BLOCK_TOKENS", "Block", "BlockStore", "StoredKV"]

# Measured on the demo model's KV shapes, 8 forks of a 1,000-token prompt (whole snapshots: 463 MB): 256 held 193 MB,
# 128 148 MB, 64 126 MB; put and take cost about alike, but each halving doubles the copies a long put starts.
BLOCK_TOKENS = 128


class Block:
    """`block_tokens` positions of the blocked layers after the token prefix its path spells. Kept per layer: stacked
    over layers, a 16k-token hit of the demo model took 2.3x as long (an index op a layer and block to read it back)."""

    __slots__ = ("parent", "key", "children", "parts", "nbytes", "refs", "owner")

    def __init__(self, parent: "Block | None", key: Any, parts: dict[int, Any], nbytes: int, owner: int | None) -> None:
        self.parent = parent
        self.key = key  # the block's tokens (a root: its namespace and layer layout)
        self.children: dict[Any, Block] = {}
        self.parts = parts  # layer index -> (keys, values) of these positions
        self.nbytes = nbytes
        self.refs = 0  # entries referring to it; its children's refs never exceed its own
        self.owner = owner  # the thread whose put started its copies and has not settled them, else None


@dataclass(eq=False)
class StoredKV:
    """One entry's KV: per layer a whole snapshot, or (blocked layers) a clone holding the tail positions."""

    layers: list[Any]
    blocked: frozenset[int]  # the layers held in blocks
    blocks: list[Block]
    own_bytes: int  # the tails and whole snapshots: this entry's alone
    added: int  # own_bytes and the blocks this put made: what it added to the cache
    fresh: list[mx.array] = field(default_factory=list)  # the copies this put started, until settled
    created: list[Block] = field(default_factory=list)
    waits: list[Block] = field(default_factory=list)  # blocks another thread's put made and had not settled

    def settled(self) -> None:
        """The copies this put started are done: any thread may read its blocks."""
        for block in self.created:
            block.owner = None
        self.fresh, self.created = [], []

    @property
    def total(self) -> int:
        """Bytes the entry refers to, shared or not."""
        return self.own_bytes + sum(b.nbytes for b in self.blocks)


def _signature(layer: Any) -> tuple:
    # Blocks are shared only between caches alike (a quantized layer's bits are part of its bytes).
    return (type(layer).__name__, getattr(layer, "bits", None), getattr(layer, "group_size", None),
            tuple((a.shape[:-2], a.shape[-1], a.dtype) for a in arrays_of((layer.keys, layer.values))))


def _cut(layer: Any, start: int, stop: int) -> Any:
    return map_arrays((layer.keys, layer.values), lambda a: mx.array(a[..., start:stop, :]))



def _join(parts: list[Any], length: int, room: int) -> Any:
    """The positions of `parts` (one (keys, values) structure each, in order) joined on axis -2, cut to `length`, with
    `room` zero positions after them (where the caller's next updates write)."""
    first = parts[0]
    if isinstance(first, mx.array):
        if len(parts) == 1 and not room:
            return first[..., :length, :]  # a new array object: the caller's in-place updates never reach a block
        cut = parts[:-1] + [parts[-1][..., :length - sum(p.shape[-2] for p in parts[:-1]), :]]  # the last may be cut
        pad = [mx.zeros((*first.shape[:-2], room, first.shape[-1]), first.dtype)] if room else []
        return mx.concatenate(cut + pad, axis=-2)
    return type(first)(_join([p[j] for p in parts], length, room) for j in range(len(first)))


class BlockStore:
    """The blocks of every namespace, a trie per namespace and layer layout."""

    def __init__(self, block_tokens: int = BLOCK_TOKENS) -> None:
        """Raises ValueError when block_tokens is not positive."""
        if block_tokens <= 0:
            raise ValueError("block_tokens must be > 0")
        self.block_tokens = block_tokens
        self._roots: dict[Any, Block] = {}

    def snapshot(self, namespace: str, tokens: tuple[int, ...], kv: Sequence[Any], owner: int) -> StoredKV:
        """An entry's KV covering len(tokens) positions of `kv`: the blocks held already are referred to, the rest
        copied (lazily: `fresh` holds the copies to start). Release it if it is not kept. Raises nothing of its own."""
        length, size = len(tokens), self.block_tokens
        blocked = [i for i, layer in enumerate(kv) if isinstance(layer, COMPACTABLE) and layer.keys is not None]
        whole = length // size if blocked else 0
        key = (namespace, tuple((i, _signature(kv[i])) for i in blocked))
        node = self._roots.get(key) or Block(None, key, {}, 0, None)
        if whole:
            self._roots[key] = node
        stored = StoredKV([], frozenset(blocked), [], 0, 0)
        for k in range(whole):
            start = k * size
            block_key = tokens[start:start + size]
            child = node.children.get(block_key)
            if child is None:
                parts = {i: _cut(kv[i], start, start + size) for i in blocked}
                arrays = list(arrays_of(parts))
                child = node.children[block_key] = Block(node, block_key, parts, sum(a.nbytes for a in arrays), owner)
                stored.fresh += arrays
                stored.created.append(child)
                stored.added += child.nbytes
            elif child.owner is not None and child.owner != owner:
                stored.waits.append(child)
            child.refs += 1
            stored.blocks.append(child)
            node = child
        for i, layer in enumerate(kv):
            if i in stored.blocked:
                clone = copy.copy(layer)
                clone.keys, clone.values = _cut(layer, whole * size, length) if length > whole * size else (None, None)
                clone.offset = length
            else:
                clone = snapshot_layer(layer, length)
            stored.layers.append(clone)
            own = list(arrays_of(clone))
            stored.fresh += own
            stored.own_bytes += sum(a.nbytes for a in own)
        stored.added += stored.own_bytes
        return stored

    def restore(self, stored: StoredKV, stored_length: int, length: int, room: int = 0) -> list[Any]:
        """Fresh per-layer cache objects holding the entry's first `length` positions, the caller's to mutate
        (bitwise the KV the entry was put with). `room`: positions the caller will add; a blocked layer has space
        for them (in mlx-lm's steps), so its first update writes there rather than copying the stitched KV again.
        Raises nothing of its own."""
        out = []
        need = -(-length // self.block_tokens)  # blocks that hold some of the first `length` positions
        for i, layer in enumerate(stored.layers):
            if i not in stored.blocked:
                out.append(restore_layer(layer, stored_length, length))
                continue
            parts = [b.parts[i] for b in stored.blocks[:need]]
            if len(parts) < need:
                parts.append((layer.keys, layer.values))
            clone = copy.copy(layer)
            step = getattr(layer, "step", 1)
            clone.keys, clone.values = _join(parts, length, -(-room // step) * step if room > 0 else 0)
            clone.offset = length
            out.append(clone)
        return out

    def release(self, stored: StoredKV) -> int:
        """Let go of an entry's KV; returns the bytes freed (its own, and the blocks no other entry refers to).
        Raises nothing."""
        freed = stored.own_bytes
        for block in reversed(stored.blocks):
            block.refs -= 1
            if block.refs == 0:
                parent = block.parent
                assert parent is not None
                del parent.children[block.key]
                block.parts = {}
                freed += block.nbytes
        if stored.blocks and not (root := stored.blocks[0].parent).children:  # type: ignore[union-attr]
            self._roots.pop(root.key, None)  # type: ignore[union-attr]
        stored.blocks, stored.layers, stored.own_bytes = [], [], 0
        return freed

    def block_count(self) -> int:
        """Blocks held, each once. Raises nothing."""
        count, stack = 0, list(self._roots.values())
        while stack:
            node = stack.pop()
            count += len(node.children)
            stack.extend(node.children.values())
        return count
