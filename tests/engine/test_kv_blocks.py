"""engine/kv_blocks.py: entries sharing a token prefix share its KV blocks, and a take stitched from blocks is bitwise
the KV a whole snapshot would have held, for plain and quantized layers; other layers keep whole snapshots."""

from __future__ import annotations

from engine.kv_blocks import BlockStore  # first: engine picks the BLAS before mlx loads

import mlx.core as mx  # noqa: E402
import pytest  # noqa: E402
from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache, RotatingKVCache  # noqa: E402

from engine.kv_snapshot import arrays_of, restore_layer, snapshot_layer  # noqa: E402


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
    assert store.release(stored[0]) == 3 * per_token  # its tail; the blocks stay for the others
    assert bitwise_equal(store.restore(stored[1], 15, 15), [restore_layer(snapshot_layer(c, 15), 15, 15)
                                                             for c in _with_prefix(live[0], live[1], 12)])
    assert sum(store.release(s) for s in stored[1:]) == 7 * 3 * per_token + 12 * per_token
    assert store.block_count() == 0


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


def _with_prefix(first: list, second: list, n: int) -> list:
    """`second`'s caches with their first n positions taken from `first` (what a fork reads)."""
    out = []
    for f, s in zip(first, second):
        c = KVCache()
        c.update_and_fetch(mx.concatenate([f.keys[..., :n, :], s.keys[..., n:s.offset, :]], axis=2),
                           mx.concatenate([f.values[..., :n, :], s.values[..., n:s.offset, :]], axis=2))
        out.append(c)
    return out
