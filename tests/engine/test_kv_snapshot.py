"""engine/kv_snapshot.py: which caches an entry can be cut back from, and a sliding layer's copy holding its window
alone yet going on exactly as the layer it copies."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache

from engine.kv_snapshot import restore_layer, snapshot_layer, trimmable_through


def test_a_sliding_window_can_be_cut_back_until_it_wraps_and_a_recurrent_state_never() -> None:
    assert trimmable_through([KVCache(), RotatingKVCache(max_size=8)], 7)
    assert not trimmable_through([KVCache(), RotatingKVCache(max_size=8)], 8)
    assert not trimmable_through([KVCache(), ArraysCache(size=2)], 1)
    assert not trimmable_through([CacheList(KVCache(), ArraysCache(size=2))], 1)
    assert trimmable_through([CacheList(KVCache(), KVCache())], 10_000)


def test_a_sliding_layers_copy_after_a_chunk_holds_its_window_and_goes_on_as_the_layer_does() -> None:
    # A prompt chunk leaves the window plus the whole chunk in the ring: a copy of all of it made an end-of-prompt
    # entry of gpt-oss or Gemma hold a chunk of keys per sliding layer that its next update drops anyway.
    def kv(n: int, seed: int) -> tuple[mx.array, mx.array]:
        keys, values = (mx.random.normal((1, 2, n, 4), key=mx.random.key(seed + i)) for i in (0, 1000))
        return keys, values

    for keep in (0, 2):
        live = RotatingKVCache(max_size=8, keep=keep)
        live.update_and_fetch(*kv(20, 0))
        copy = snapshot_layer(live, 20)
        assert live.keys.shape[2] == 20 and copy.keys.shape[2] == 8 and copy.offset == 20
        resumed = restore_layer(copy, 20, 20)
        for step, n in enumerate((5, 1, 1, 3, 1)):  # a chunk, decode steps, another chunk: the same keys each time
            new = kv(n, 10 + step)
            mask = [c.make_mask(n, window_size=6, return_array=True) for c in (live, resumed)]
            assert all(mx.array_equal(a, b).item() for a, b in zip(live.update_and_fetch(*new),
                                                                   resumed.update_and_fetch(*new)))
            assert (mask[0] is None) == (mask[1] is None) and (mask[0] is None or mx.array_equal(*mask).item())
