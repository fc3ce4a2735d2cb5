"""Shared KV blocks under the prefix cache's entries: entries of one namespace that share a token prefix share that
prefix's keys and values (causal attention: a position's K/V depend only on the tokens up to it).

Layers that keep every position on axis -2 (mlx-lm's KVCache, QuantizedKVCache) are stored in blocks of
`block_tokens` positions aligned to absolute positions, in a trie keyed by each block's tokens, so a block stands for
the whole token prefix up to its end. An entry refers to the blocks its tokens fill and to the positions past its last
whole block (its tail). A put copies only the positions not held yet (its new blocks and its tail) into one `Buffer`,
one array per layer and keys/values, and its new blocks are ranges of it: a copy per block and layer made a 2,048-token
put of a 16-layer model start 512 copies on the engine thread where a whole snapshot started 32. A block goes when the
last entry referring to it does, a buffer's bytes when its last block and tail do. Other layers (sliding windows,
recurrent states, CacheList) keep a whole snapshot per entry. Engine threads only, under the prefix cache's lock.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Sequence

import mlx.core as mx

from engine.kv_snapshot import COMPACTABLE, arrays_of, map_arrays, restore_layer, snapshot_layer

__all__ = ["BLOCK_TOKENS", "Block", "Buffer", "BlockStore", "StoredKV"]

# Measured on the demo model's KV shapes, 8 forks of a 1,000-token prompt (whole snapshots: 463 MB): 256 held 193 MB,
# 128 148 MB, 64 126 MB; put and take cost about alike.
BLOCK_TOKENS = 128


class Buffer:
    """The positions one put copied, [start, start + length) of its blocked layers, one array per layer and keys/values
    (kept per layer: stacked over layers, a 16k-token hit of the demo model took 2.3x as long). Its bytes are held while
    any block in it or the tail of the entry that made it is."""

    __slots__ = ("parts", "start", "nbytes", "users", "owner")

    def __init__(self, parts: dict[int, Any], start: int, owner: int | None) -> None:
        self.parts = parts  # layer index -> (keys, values) of these positions
        self.start = start
        self.nbytes = sum(a.nbytes for a in arrays_of(parts))
        self.users = 0  # blocks in it, and the tail of the entry that made it while that entry lives
        self.owner = owner  # the thread whose put started its copies and has not settled them, else None


class Block:
    """`block_tokens` positions of the blocked layers after the token prefix its path spells: a range of a buffer."""

    __slots__ = ("parent", "key", "children", "buffer", "refs")

    def __init__(self, parent: "Block | None", key: Any, buffer: Buffer | None) -> None:
        self.parent = parent
        self.key = key  # the block's tokens (a root: its namespace and layer layout)
        self.children: dict[Any, Block] = {}
        self.buffer = buffer  # None at a root
        self.refs = 0  # entries referring to it; its children's refs never exceed its own


@dataclass(eq=False)
class StoredKV:
    """One entry's KV: per layer a whole snapshot, or (blocked layers) an empty clone; the blocked layers' positions are
    its blocks' and its tail's."""

    layers: list[Any]
    blocked: frozenset[int]  # the layers held in blocks
    blocks: list[Block]
    own_bytes: int  # the whole snapshots: this entry's alone
    added: int  # own_bytes and the buffer this put made: what it added to the cache
    tail: Buffer | None = None  # the buffer holding the positions past its last whole block, if any
    fresh: list[mx.array] = field(default_factory=list)  # the copies this put started, until settled
    created: Buffer | None = None
    waits: list[Buffer] = field(default_factory=list)  # buffers another thread's put made and had not settled

    def settled(self) -> None:
        """The copies this put started are done: any thread may read its blocks."""
        if self.created is not None:
            self.created.owner = None
        self.fresh, self.created = [], None

    @property
    def total(self) -> int:
        """Bytes the entry holds, shared or not."""
        buffers = {id(b.buffer): b.buffer for b in self.blocks} | ({id(self.tail): self.tail} if self.tail else {})
        return self.own_bytes + sum(b.nbytes for b in buffers.values() if b is not None)


def _signature(layer: Any) -> tuple:
    # Blocks are shared only between caches alike (a quantized layer's bits are part of its bytes).
    return (type(layer).__name__, getattr(layer, "bits", None), getattr(layer, "group_size", None),
            tuple((a.shape[:-2], a.shape[-1], a.dtype) for a in arrays_of((layer.keys, layer.values))))


def _cut(layer: Any, start: int, stop: int) -> Any:
    return map_arrays((layer.keys, layer.values), lambda a: mx.array(a[..., start:stop, :]))


def _ranges(blocks: list[Block], tail: Buffer | None, size: int, length: int) -> list[tuple[Buffer, int, int]]:
    """(buffer, start, stop) in buffer positions covering absolute positions [0, length), consecutive ranges of one
    buffer merged: a take reads a slice per buffer, not per block."""
    out: list[tuple[Buffer, int, int]] = []
    spans = [(b.buffer, k * size, (k + 1) * size) for k, b in enumerate(blocks)]
    if tail is not None:
        spans.append((tail, len(blocks) * size, length))
    for buffer, start, stop in spans:
        assert buffer is not None
        start, stop = start - buffer.start, min(stop, length) - buffer.start
        if out and out[-1][0] is buffer and out[-1][2] == start:
            out[-1] = (buffer, out[-1][1], stop)
        else:
            out.append((buffer, start, stop))
    return out


def _join(parts: list[Any], room: int) -> Any:
    """The positions of `parts` (one (keys, values) structure each, in order) joined on axis -2, with `room` zero
    positions after them (where the caller's next updates write)."""
    first = parts[0]
    if isinstance(first, mx.array):
        if len(parts) == 1 and not room:
            return first  # a slice, a new array object: the caller's in-place updates never reach a buffer
        pad = [mx.zeros((*first.shape[:-2], room, first.shape[-1]), first.dtype)] if room else []
        return mx.concatenate(parts + pad, axis=-2)
    return type(first)(_join([p[j] for p in parts], room) for j in range(len(first)))


class BlockStore:
    """The blocks of every namespace, a trie per namespace and layer layout."""

    def __init__(self, block_tokens: int = BLOCK_TOKENS) -> None:
        """Raises ValueError when block_tokens is not positive."""
        if block_tokens <= 0:
            raise ValueError("block_tokens must be > 0")
        self.block_tokens = block_tokens
        self._roots: dict[Any, Block] = {}
        self._buffers: dict[int, Buffer] = {}  # the live buffers, by id

    def snapshot(self, namespace: str, tokens: tuple[int, ...], kv: Sequence[Any], owner: int) -> StoredKV:
        """An entry's KV covering len(tokens) positions of `kv`: the blocks held already are referred to, the rest
        copied into one buffer (lazily: `fresh` holds the copies to start). Release it if it is not kept. Raises
        nothing of its own."""
        length, size = len(tokens), self.block_tokens
        blocked = [i for i, layer in enumerate(kv) if isinstance(layer, COMPACTABLE) and layer.keys is not None]
        whole = length // size if blocked else 0
        key = (namespace, tuple((i, _signature(kv[i])) for i in blocked))
        node = self._roots.get(key) or Block(None, key, None)
        if whole:
            self._roots[key] = node
        stored = StoredKV([], frozenset(blocked), [], 0, 0)
        k = 0
        while k < whole and (child := node.children.get(tokens[k * size:(k + 1) * size])) is not None:
            buffer = child.buffer
            assert buffer is not None
            if buffer.owner not in (None, owner) and buffer not in stored.waits:
                stored.waits.append(buffer)
            child.refs += 1
            stored.blocks.append(child)
            node, k = child, k + 1
        if blocked and length > k * size:  # past the blocks held: the new blocks (a fresh path) and the tail
            buffer = Buffer({i: _cut(kv[i], k * size, length) for i in blocked}, k * size, owner)
            self._buffers[id(buffer)] = buffer
            stored.fresh += arrays_of(buffer.parts)
            stored.created, stored.added = buffer, buffer.nbytes
            for k in range(k, whole):
                block_key = tokens[k * size:(k + 1) * size]
                child = node.children[block_key] = Block(node, block_key, buffer)
                buffer.users += 1
                child.refs += 1
                stored.blocks.append(child)
                node = child
            if length > whole * size:
                stored.tail = buffer
                buffer.users += 1
        for i, layer in enumerate(kv):
            if i in stored.blocked:
                clone = copy.copy(layer)
                clone.keys, clone.values, clone.offset = None, None, length
            else:
                clone = snapshot_layer(layer, length)
                own = list(arrays_of(clone))
                stored.fresh += own
                stored.own_bytes += sum(a.nbytes for a in own)
            stored.layers.append(clone)
        stored.added += stored.own_bytes
        return stored

    def restore(self, stored: StoredKV, stored_length: int, length: int, room: int = 0) -> list[Any]:
        """Fresh per-layer cache objects holding the entry's first `length` positions, the caller's to mutate
        (bitwise the KV the entry was put with). `room`: positions the caller will add; a blocked layer has space
        for them (in mlx-lm's steps), so its first update writes there rather than copying the stitched KV again.
        Raises nothing of its own."""
        need = -(-length // self.block_tokens)  # blocks that hold some of the first `length` positions
        ranges = _ranges(stored.blocks[:need], stored.tail if need > len(stored.blocks) else None,
                         self.block_tokens, length)
        out = []
        for i, layer in enumerate(stored.layers):
            if i not in stored.blocked:
                out.append(restore_layer(layer, stored_length, length))
                continue
            parts = [map_arrays(buffer.parts[i], lambda a, s=start, e=stop: a[..., s:e, :])
                     for buffer, start, stop in ranges]
            clone = copy.copy(layer)
            step = getattr(layer, "step", 1)
            clone.keys, clone.values = _join(parts, -(-room // step) * step if room > 0 else 0)
            clone.offset = length
            out.append(clone)
        return out

    def release(self, stored: StoredKV) -> int:
        """Let go of an entry's KV; returns the bytes freed (its own, and the buffers no block or tail is left in).
        Raises nothing."""
        freed = stored.own_bytes
        users = [stored.tail] if stored.tail is not None else []
        for block in reversed(stored.blocks):
            block.refs -= 1
            if block.refs == 0:
                parent = block.parent
                assert parent is not None and block.buffer is not None
                del parent.children[block.key]
                users.append(block.buffer)
        for buffer in users:
            buffer.users -= 1
            if buffer.users == 0:
                del self._buffers[id(buffer)]
                buffer.parts = {}
                freed += buffer.nbytes
        if stored.blocks and not (root := stored.blocks[0].parent).children:  # type: ignore[union-attr]
            self._roots.pop(root.key, None)  # type: ignore[union-attr]
        stored.blocks, stored.layers, stored.own_bytes, stored.tail = [], [], 0, None
        return freed

    def block_count(self) -> int:
        """Blocks held, each once. Raises nothing."""
        count, stack = 0, list(self._roots.values())
        while stack:
            node = stack.pop()
            count += len(node.children)
            stack.extend(node.children.values())
        return count

    def buffer_bytes(self) -> int:
        """Bytes of the live buffers, each once. Raises nothing."""
        return sum(b.nbytes for b in self._buffers.values())
