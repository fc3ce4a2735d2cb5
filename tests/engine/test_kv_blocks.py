"""engine/kv_blocks.py: entries sharing a token prefix share its KV blocks, and a take stitched from blocks is bitwise
the KV a whole snapshot would have held, for plain and quantized layers; other layers keep whole snapshots."""

from __future__ import annotations

from engine.kv_blocks import BlockStore, _ranges  # first: engine picks the BLAS before mlx loads

import mlx.core as mx  # noqa: E402
import pytest  # noqa: E402
from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache, RotatingKVCache  # noqa: E402

from engine.kv_snapshot import arrays_of, map_arrays, restore_layer, snapshot_layer  # noqa: E402


def random_kv(n: int, seed: int, quantized: bool = False) -> list:
    """Two layers of random keys and values for n positions (quantized: QuantizedKVCache, 8 bits, groups of 32)."""
    out = []
    for layer in range(2):
        cache = QuantizedKVCache(group_size=32, bits=8) if quantized else KVCache()
        keys, values = (mx.random.normal((1, 2, n, 64), key=mx.random.key(seed * 10 + layer * 2 + i)) for i in (0, 1))
        cache.update_and_fetch(keys, values)
        out.append(cache)
    return out


def flat(layer) -> list[mx.array]:
    keys, values = layer.keys, layer.values
    return [a[..., :layer.offset, :] for a in arrays_of((keys, values))]


def bitwise_equal(a: list, b: list) -> bool:
    return all(x.offset == y.offset and all(mx.array_equal(p, q).item() for p, q in zip(flat(x), flat(y)))
               for x, y in zip(a, b))


@pytest.mark.parametrize("quantized", [False, True])
def test_a_take_stitched_from_blocks_is_bitwise_a_whole_snapshots_kv(quantized: bool) -> None:
    store = BlockStore(block_tokens=4)
    live = random_kv(11, 1, quantized)
    tokens = tuple(range(11))
    stored = store.snapshot("m", tokens, live, owner=0)
    assert len(stored.blocks) == 2  # positions 0-7 in blocks, 8-10 the entry's own tail
    mx.eval(stored.fresh)
    for length in (1, 4, 5, 8, 9, 11):  # inside a block, at block edges, into the tail
        whole = [restore_layer(snapshot_layer(layer, 11), 11, length) for layer in live]  # the cache before blocks
        assert bitwise_equal(store.restore(stored, 11, length), whole)
        # With room for the rest of the prompt, the next update writes into it, and reads back the same KV.
        roomy = store.restore(stored, 11, length, room=3)
        assert all(a.shape[-2] == length + 256 for layer in roomy for a in arrays_of((layer.keys, layer.values)))
        new = [mx.random.normal((1, 2, 3, 64), key=mx.random.key(length + i)) for i in (0, 1)]
        for a, b in zip(roomy, whole):
            for x, y in zip(arrays_of(a.update_and_fetch(*new)), arrays_of(b.update_and_fetch(*new))):
                assert mx.array_equal(x, y).item()
            assert a.offset == b.offset == length + 3


def test_forks_share_their_prefix_blocks_and_the_last_one_frees_them() -> None:
    store = BlockStore(block_tokens=4)
    prefix = tuple(range(100, 112))
    forks = [prefix + (i, i + 1, i + 2) for i in range(8)]
    live = [random_kv(15, seed) for seed in range(8)]
    stored = [store.snapshot("m", t, kv, owner=0) for t, kv in zip(forks, live)]
    per_token = 2 * 2 * (2 * 64 * 4)  # layers x (keys, values) x heads x dims x float32
    assert stored[0].added == 15 * per_token
    assert [s.added for s in stored[1:]] == [3 * per_token] * 7  # the 12 shared positions are the first fork's
    assert store.block_count() == 3
    # Every fork reads the first fork's blocks for the prefix, then its own tail.
    for s, kv in zip(stored[1:], live[1:]):
        restored = store.restore(s, 15, 15)
        assert bitwise_equal([_cut(c, 12) for c in restored], [_cut(c, 12) for c in store.restore(stored[0], 15, 15)])
        assert all(mx.array_equal(r.keys[..., 12:, :], c.keys[..., 12:15, :]).item() for r, c in zip(restored, kv))
    # Its tail shares one buffer with the blocks the others read: the buffer's bytes stay until its last user goes.
    assert store.release(stored[0]) == 0 and store.buffer_bytes() == 15 * per_token + 7 * 3 * per_token
    assert bitwise_equal(store.restore(stored[1], 15, 15), [restore_layer(snapshot_layer(c, 15), 15, 15)
                                                             for c in _with_prefix(live[0], live[1], 12)])
    assert [store.release(s) for s in stored[1:]] == [3 * per_token] * 6 + [3 * per_token + 15 * per_token]
    assert store.buffer_bytes() == 0
    assert store.block_count() == 0


@pytest.mark.parametrize("quantized", [False, True])
def test_a_put_copies_the_positions_it_adds_in_one_array_per_layer_and_a_take_reads_a_slice_per_buffer(
        quantized: bool) -> None:
    # A copy per block, layer and keys/values made a 2,048-token put of a 16-layer model start 512 copies on the
    # engine thread (a kernel launch each on a GPU, between decode steps) where a whole snapshot started 32.
    store = BlockStore(block_tokens=4)
    per_layer = 6 if quantized else 2  # keys and values (quantized: codes, scales and biases each)
    first = random_kv(35, 1, quantized)  # 8 whole blocks and a 3-position tail
    stored = store.snapshot("m", tuple(range(35)), first, owner=0)
    assert len(stored.blocks) == 8 and len(stored.fresh) == 2 * per_layer
    fork = random_kv(31, 2, quantized)  # the first 5 blocks shared, 2 new blocks and a tail
    tokens = tuple(range(20)) + tuple(range(500, 511))
    forked = store.snapshot("m", tokens, fork, owner=0)
    assert len(forked.fresh) == 2 * per_layer and store.block_count() == 10
    assert forked.added == sum(a.nbytes for a in arrays_of([snapshot_layer(c, 11) for c in fork]))  # positions 20-30
    mx.eval(stored.fresh + forked.fresh)
    assert len(_ranges(forked.blocks, forked.tail, 4, 31)) == 2  # the first put's buffer, then its own
    expected = [restore_layer(snapshot_layer(c, 31), 31, 31) for c in _with_prefix(first, fork, 20, quantized)]
    assert bitwise_equal(store.restore(forked, 31, 31), expected)


def test_layers_that_are_not_compactable_keep_a_whole_snapshot_per_entry() -> None:
    store = BlockStore(block_tokens=4)

    def hybrid(seed: int) -> list:
        kv = random_kv(9, seed)[:1]
        window = RotatingKVCache(max_size=16)
        window.update_and_fetch(*(mx.random.normal((1, 2, 9, 64), key=mx.random.key(seed + 50 + i)) for i in (0, 1)))
        state = ArraysCache(size=1)
        state[0] = mx.random.normal((1, 8), key=mx.random.key(seed + 99))
        return [*kv, window, state]

    a, b = hybrid(1), hybrid(2)
    stored = [store.snapshot("m", tuple(range(9)), kv, owner=0) for kv in (a, b)]
    assert [len(s.blocks) for s in stored] == [2, 2] and store.block_count() == 2  # the KVCache layer's blocks
    window_bytes = 2 * 2 * 9 * 64 * 4
    assert stored[1].added == 2 * 2 * 64 * 4 + window_bytes + 8 * 4  # a 1-position tail, the window, the state
    restored = store.restore(stored[1], 9, 9)
    assert mx.array_equal(restored[1].keys[..., :9, :], b[1].keys[..., :9, :]).item()
    assert mx.array_equal(restored[2][0], b[2][0]).item()
    assert mx.array_equal(restored[0].keys[..., :8, :], a[0].keys[..., :8, :]).item()  # the first entry's blocks
    assert mx.array_equal(restored[0].keys[..., 8:, :], b[0].keys[..., 8:9, :]).item()  # then its own tail


def _cut(layer, n: int):
    return restore_layer(layer, layer.offset, n)


def _with_prefix(first: list, second: list, n: int, quantized: bool = False) -> list:
    """`second`'s caches with their first n positions taken from `first` (what a fork reads)."""
    out = []
    for f, s in zip(first, second):
        c = QuantizedKVCache(group_size=32, bits=8) if quantized else KVCache()
        c.keys, c.values = (map_arrays(b, lambda q, p=iter(arrays_of(a)): mx.concatenate(
            [next(p)[..., :n, :], q[..., n:s.offset, :]], axis=2)) for a, b in ((f.keys, s.keys), (f.values, s.values)))
        c.offset = s.offset
        out.append(c)
    return out
