"""PrefixCache: longest prefix, trim, byte budget, eviction order, namespaces, session affinity."""

from __future__ import annotations

import threading

from engine.prefix_cache import PrefixCache  # first: engine picks the BLAS before mlx loads

import mlx.core as mx  # noqa: E402
import pytest  # noqa: E402
from mlx_lm.models.cache import ArraysCache, KVCache  # noqa: E402

LAYERS = 2


def kv_for(tokens, layers: int = LAYERS) -> list[KVCache]:
    """Per-layer KVCache whose position i holds the value tokens[i] * 10 + layer (easy to check)."""
    caches = []
    for layer in range(layers):
        cache = KVCache()
        if tokens:
            col = mx.array([float(t * 10 + layer) for t in tokens]).reshape(1, 1, len(tokens), 1)
            block = mx.broadcast_to(col, (1, 2, len(tokens), 4))
            cache.update_and_fetch(block, block + 0.5)
        caches.append(cache)
    return caches


def contents(kv: list[KVCache]) -> list[list[int]]:
    """Token ids recovered from each layer's keys (positions [0, offset))."""
    out = []
    for layer, cache in enumerate(kv):
        keys, values = cache.keys_and_values() if cache.keys is not None else (mx.zeros((1, 2, 0, 4)),) * 2
        assert keys.shape[2] == cache.offset
        assert mx.array_equal(values, keys + 0.5)
        out.append([int(round((float(v) - layer) / 10)) for v in keys[0, 0, :, 0].tolist()])
    return out


def entry_bytes(n: int) -> int:
    """Bytes of a compact n-token snapshot: layers x (keys, values) x 2 heads x 4 dims x float32."""
    return LAYERS * 2 * (2 * n * 4 * 4)


def test_miss_on_empty_cache():
    cache = PrefixCache(1 << 20)
    assert cache.take("m", [1, 2, 3]) == (0, None)
    assert cache.stats()["misses"] == 1


def test_longest_prefix_wins():
    cache = PrefixCache(1 << 20)
    cache.put("m", [1, 2], kv_for([1, 2]), system_prefix=True)
    cache.put("m", [1, 2, 3, 4], kv_for([1, 2, 3, 4]))
    cache.put("m", [1, 9], kv_for([1, 9]))
    n, kv = cache.take("m", [1, 2, 3, 4, 5, 6])
    assert n == 4
    assert contents(kv) == [[1, 2, 3, 4]] * LAYERS
    n, kv = cache.take("m", [1, 9, 9])
    assert (n, contents(kv)) == (2, [[1, 9]] * LAYERS)


def test_at_least_one_token_left_to_prefill():
    cache = PrefixCache(1 << 20)
    cache.put("m", [1, 2, 3], kv_for([1, 2, 3]))
    n, kv = cache.take("m", [1, 2, 3])
    assert n == 2
    assert contents(kv) == [[1, 2]] * LAYERS
    assert cache.take("m", [1]) == (0, None)


def test_longer_entry_is_trimmed_to_common_prefix():
    cache = PrefixCache(1 << 20)
    cache.put("m", [1, 2, 3, 4, 5], kv_for([1, 2, 3, 4, 5]))
    n, kv = cache.take("m", [1, 2, 3, 7, 8])
    assert n == 3
    assert contents(kv) == [[1, 2, 3]] * LAYERS
    # The stored entry is untouched: a later exact continuation still gets all five tokens.
    n, kv = cache.take("m", [1, 2, 3, 4, 5, 6])
    assert (n, contents(kv)) == (5, [[1, 2, 3, 4, 5]] * LAYERS)


def test_returned_kv_is_independent_of_the_entry():
    cache = PrefixCache(1 << 20)
    cache.put("m", [1, 2, 3, 4], kv_for([1, 2, 3, 4]))
    n, kv = cache.take("m", [1, 2, 5, 6])
    assert n == 2
    # Writing into the trimmed caches (in-place slice update) must not reach the stored snapshot.
    extra = mx.full((1, 2, 1, 4), 990.0)
    for layer in kv:
        layer.update_and_fetch(extra, extra + 0.5)
    n, kv = cache.take("m", [1, 2, 3, 4, 9])
    assert contents(kv) == [[1, 2, 3, 4]] * LAYERS


def test_put_snapshot_is_independent_of_the_live_row():
    cache = PrefixCache(1 << 20)
    live = kv_for([1, 2, 3])
    cache.put("m", [1, 2, 3], live)
    for layer in live:
        layer.trim(1)
        extra = mx.full((1, 2, 1, 4), 770.0)
        layer.update_and_fetch(extra, extra + 0.5)
    n, kv = cache.take("m", [1, 2, 3, 4])
    assert contents(kv) == [[1, 2, 3]] * LAYERS


def test_put_cuts_kv_that_runs_past_the_boundary():
    cache = PrefixCache(1 << 20)
    cache.put("m", [1, 2], kv_for([1, 2, 3, 4]), system_prefix=True)
    n, kv = cache.take("m", [1, 2, 8])
    assert (n, contents(kv)) == (2, [[1, 2]] * LAYERS)
    assert cache.stats()["bytes"] == entry_bytes(2)


def test_put_stores_only_the_tokens_the_kv_covers():
    cache = PrefixCache(1 << 20)
    # Prompt + generation where the last sampled token was never fed through the model.
    cache.put("m", [1, 2, 3, 4], kv_for([1, 2, 3]))
    n, kv = cache.take("m", [1, 2, 3, 4, 5])
    assert (n, contents(kv)) == (3, [[1, 2, 3]] * LAYERS)


def test_namespaces_are_separate():
    cache = PrefixCache(1 << 20)
    cache.put("model-a", [1, 2, 3], kv_for([1, 2, 3]))
    assert cache.take("model-b", [1, 2, 3, 4]) == (0, None)
    assert cache.take("model-a", [1, 2, 3, 4])[0] == 3


def test_longer_entry_replaces_its_trimmable_prefixes():
    cache = PrefixCache(1 << 20)
    cache.put("m", [1, 2], kv_for([1, 2]))
    cache.put("m", [1, 2, 3, 4], kv_for([1, 2, 3, 4]))
    assert cache.stats()["entries"] == 1
    assert cache.stats()["bytes"] == entry_bytes(4)
    # The trimmed longer entry still serves the shorter prompt.
    n, kv = cache.take("m", [1, 2, 7])
    assert (n, contents(kv)) == (2, [[1, 2]] * LAYERS)


def test_byte_budget_evicts_least_recently_used_first():
    size = entry_bytes(3)
    cache = PrefixCache(2 * size, probation_share=1.0)  # one segment as large as the budget: plain LRU
    cache.put("m", [1, 1, 1], kv_for([1, 1, 1]))
    cache.put("m", [2, 2, 2], kv_for([2, 2, 2]))
    assert cache.take("m", [1, 1, 1, 0])[0] == 3  # touch 1: 2 is now the oldest
    cache.put("m", [3, 3, 3], kv_for([3, 3, 3]))
    assert cache.stats()["bytes"] <= 2 * size
    assert cache.take("m", [2, 2, 2, 0]) == (0, None)
    assert cache.take("m", [1, 1, 1, 0])[0] == 3
    assert cache.take("m", [3, 3, 3, 0])[0] == 3
    assert cache.stats()["evictions"] == 1


def test_system_prefixes_are_evicted_last():
    size = entry_bytes(3)
    cache = PrefixCache(2 * size, probation_share=1.0)
    cache.put("m", [9, 9, 9], kv_for([9, 9, 9]), system_prefix=True)
    cache.put("m", [1, 1, 1], kv_for([1, 1, 1]))
    cache.put("m", [2, 2, 2], kv_for([2, 2, 2]))
    assert cache.take("m", [9, 9, 9, 0])[0] == 3
    assert cache.take("m", [1, 1, 1, 0]) == (0, None)
    cache.max_bytes = size // 2
    cache.reclaim()
    assert cache.stats()["entries"] == 0
    assert cache.stats()["bytes"] == 0


def test_entry_larger_than_budget_is_not_stored():
    cache = PrefixCache(entry_bytes(2))
    cache.put("m", [1, 2, 3, 4], kv_for([1, 2, 3, 4]))
    assert cache.stats()["entries"] == 0
    assert cache.take("m", [1, 2, 3, 4, 5]) == (0, None)


def test_a_put_says_which_positions_it_newly_stored():
    # what a row wrote into the cache (usage's cache_write_tokens): nothing where the cache held the tokens already
    cache = PrefixCache(1 << 20)
    assert cache.put("m", [1, 2, 3], kv_for([1, 2, 3])) == range(0, 3)
    assert not cache.put("m", [1, 2, 3], kv_for([1, 2, 3]))  # the same entry
    assert not cache.put("m", [1, 2], kv_for([1, 2]))  # a longer trimmable entry holds them
    assert cache.put("m", [1, 2, 3, 4, 5], kv_for([1, 2, 3, 4])) == range(3, 4)  # the tokens the KV covers
    assert cache.put("m", [9, 9], kv_for([9, 9]), system_prefix=True) == range(0, 2)
    assert not PrefixCache(entry_bytes(2)).put("m", [1, 2, 3], kv_for([1, 2, 3]))  # over the budget
    assert not PrefixCache(0).put("m", [1, 2, 3], kv_for([1, 2, 3]))


def test_a_put_counts_as_new_only_the_tokens_no_entry_held():
    # The tokens of an entry on the new one's path, or shared with a longer trimmable entry beside it, were held
    # already: a seeded row prefilling a cached system prefix again wrote it again in usage (36 of 36 tokens).
    cache = PrefixCache(1 << 20)
    cache.put("m", [1, 2], kv_for([1, 2]), system_prefix=True)
    assert cache.put("m", [1, 2, 3, 4], kv_for([1, 2, 3, 4])) == range(2, 4)  # past the system prefix
    assert cache.put("m", [1, 2, 3, 7, 8], kv_for([1, 2, 3, 7, 8])) == range(3, 5)  # a sibling: 1 2 3 held
    assert cache.put("m", [1, 2, 3, 7, 8, 9], kv_for([1, 2, 3, 7, 8, 9])) == range(5, 6)  # replaces 1 2 3 7 8
    assert not cache.put("m", [1, 2, 3], kv_for([1, 2, 3]), system_prefix=True)  # stored, but held already
    assert cache.stats()["entries"] == 4
    state = ArraysCache(1)
    state[0] = mx.ones((1, 3))
    cache.put("ssm", [1, 2, 3, 4], [state])
    assert cache.put("ssm", [1, 2, 5], [state]) == range(0, 3)  # no lookup trims an untrimmable entry
    assert cache.put("ssm", [1, 2, 5, 6], [state]) == range(3, 4)


def test_an_evicted_entry_holds_nothing_for_the_next_put():
    size = entry_bytes(3)
    cache = PrefixCache(size, probation_share=1.0)
    assert cache.put("m", [1, 2, 3], kv_for([1, 2, 3])) == range(0, 3)
    assert cache.put("m", [4, 5, 6], kv_for([4, 5, 6])) == range(0, 3)  # evicts 1 2 3
    assert cache.put("m", [1, 2], kv_for([1, 2])) == range(0, 2)
    # a put its own entry leaves at once (behind a system prefix that fills the budget) stored nothing
    full = PrefixCache(size, probation_share=1.0)
    full.put("m", [7, 7], kv_for([7, 7]), system_prefix=True)
    assert not full.put("m", [8, 8], kv_for([8, 8]), session_id="s") and full.stats()["entries"] == 1


def test_zero_budget_disables_the_cache():
    cache = PrefixCache(0)
    cache.put("m", [1, 2, 3], kv_for([1, 2, 3]))
    assert cache.take("m", [1, 2, 3, 4]) == (0, None)
    assert cache.stats()["entries"] == 0


def test_closed_session_entries_are_evicted_first():
    size = entry_bytes(3)
    cache = PrefixCache(2 * size)
    cache.put("m", [1, 1, 1], kv_for([1, 1, 1]), session_id="a")
    cache.put("m", [2, 2, 2], kv_for([2, 2, 2]), session_id="b")
    cache.close_session("b")
    cache.put("m", [3, 3, 3], kv_for([3, 3, 3]))
    assert cache.take("m", [2, 2, 2, 0]) == (0, None)
    assert cache.take("m", [1, 1, 1, 0])[0] == 3
    cache.close_session("never-opened")


def test_one_shot_prompts_churn_through_probation_and_leave_hit_entries_alone():
    # Plain LRU filled the whole budget with prompts never seen again (a 10-minute soak: RSS 1.66x its first
    # minute) and pushed out the conversations that come back.
    size = entry_bytes(3)
    cache = PrefixCache(10 * size, probation_share=0.25)
    cache.put("m", [1, 1, 1], kv_for([1, 1, 1]))
    assert cache.take("m", [1, 1, 1, 0])[0] == 3  # a hit: promoted
    for t in range(2, 12):
        cache.put("m", [t] * 3, kv_for([t] * 3))
    stats = cache.stats()
    assert stats["probation_bytes"] <= 2.5 * size and stats["bytes"] == size + stats["probation_bytes"]
    assert stats["promotions"] == 1
    assert cache.take("m", [1, 1, 1, 0])[0] == 3
    assert cache.take("m", [11, 11, 11, 0])[0] == 3  # the newest one-shot entries are still there
    assert cache.take("m", [2, 2, 2, 0]) == (0, None)


def test_probation_keeps_its_newest_entry_even_past_its_share():
    # A long agent prompt's first turn must survive until its second turn hits it.
    cache = PrefixCache(4 * entry_bytes(8))  # probation: half an 8-token entry
    cache.put("m", [1] * 8, kv_for([1] * 8))
    assert cache.take("m", [1] * 8 + [2])[0] == 8
    cache.put("m", [3] * 8, kv_for([3] * 8))
    cache.put("m", [4] * 8, kv_for([4] * 8))
    assert cache.take("m", [3] * 8 + [0]) == (0, None)
    assert cache.take("m", [4] * 8 + [0])[0] == 8
    assert cache.take("m", [1] * 8 + [2])[0] == 8


def test_sessions_and_a_protected_entrys_next_turn_start_protected():
    cache = PrefixCache(100 * entry_bytes(5))
    cache.put("m", [1, 1, 1], kv_for([1, 1, 1]), session_id="a")
    cache.put("m", [5, 5, 5], kv_for([5, 5, 5]))
    assert cache.stats()["probation_bytes"] == entry_bytes(3)
    assert cache.take("m", [5, 5, 5, 6])[0] == 3  # turn 2 hits turn 1: promoted
    cache.put("m", [5, 5, 5, 6, 7], kv_for([5, 5, 5, 6, 7]))  # turn 2's put extends it
    cache.put("m", [9, 9, 9], kv_for([9, 9, 9]), system_prefix=True)
    cache.put("m", [9, 9, 9, 8], kv_for([9, 9, 9, 8]))  # below a system prefix alone: on probation
    stats = cache.stats()
    assert stats["entries"] == 4 and stats["probation_bytes"] == entry_bytes(4)
    cache.close_session("a")  # a closed session's entry goes back on probation, first to leave
    assert cache.stats()["probation_bytes"] == entry_bytes(4) + entry_bytes(3)


def test_probation_share_must_be_a_fraction():
    for share in (0.0, 1.5):
        with pytest.raises(ValueError, match="probation_share"):
            PrefixCache(100, probation_share=share)


def _populate(cache: PrefixCache, with_sessions: bool) -> None:
    sid = (lambda s: s) if with_sessions else (lambda s: None)
    cache.put("m", [5, 5], kv_for([5, 5]), sid("s1"), system_prefix=True)
    cache.put("m", [5, 5, 1, 2, 3], kv_for([5, 5, 1, 2, 3]), sid("s1"))
    cache.put("m", [5, 5, 1, 2, 4, 6], kv_for([5, 5, 1, 2, 4, 6]), sid("s2"))
    cache.put("m", [5, 5, 7], kv_for([5, 5, 7]), sid("s3"))


@pytest.mark.parametrize(
    "prompt",
    [
        [5, 5, 1, 2, 3, 8],
        [5, 5, 1, 2, 4, 6, 9],
        [5, 5, 1, 2, 9],
        [5, 5, 7],
        [5, 5, 9, 9],
        [5, 5, 1, 2, 3],
        [4, 4, 4],
    ],
)
@pytest.mark.parametrize("session", ["s1", "s2", "s3", "unknown"])
def test_session_affinity_never_changes_what_take_returns(prompt, session):
    plain, hinted = PrefixCache(1 << 20), PrefixCache(1 << 20)
    _populate(plain, with_sessions=False)
    _populate(hinted, with_sessions=True)
    n_plain, kv_plain = plain.take("m", prompt)
    n_hint, kv_hint = hinted.take("m", prompt, session_id=session)
    assert n_plain == n_hint
    assert (kv_plain is None) == (kv_hint is None)
    if kv_plain is not None:
        assert contents(kv_plain) == contents(kv_hint) == [prompt[:n_plain]] * LAYERS


def test_untrimmable_cache_is_used_only_as_an_exact_prefix():
    cache = PrefixCache(1 << 20)
    state = ArraysCache(1)
    state[0] = mx.ones((1, 3))
    cache.put("ssm", [1, 2, 3], [state])
    assert cache.take("ssm", [1, 2, 9, 9]) == (0, None)
    n, kv = cache.take("ssm", [1, 2, 3, 4])
    assert n == 3
    assert kv[0] is not state and mx.array_equal(kv[0][0], state[0])


def test_a_hybrid_state_past_the_tokens_is_not_stored_and_raises_nothing():
    # A row that left mid-step wrote a position past what it fed; an attention layer can be cut back to it, a
    # recurrent state cannot: no entry (it would answer for those tokens wrongly), and no error either (it was
    # logged as a failed put with a traceback each time).
    cache = PrefixCache(1 << 20)
    state = ArraysCache(1)
    state[0] = mx.ones((1, 3))
    cache.put("hybrid", [1, 2, 3], [kv_for([1, 2, 3, 4])[0], state])
    assert cache.take("hybrid", [1, 2, 3, 4, 5]) == (0, None) and cache.stats()["entries"] == 0


def test_stats_count_hits_and_tokens():
    cache = PrefixCache(1 << 20)
    cache.put("m", [1, 2, 3], kv_for([1, 2, 3]))
    cache.take("m", [1, 2, 3, 4])
    cache.take("m", [7, 7])
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["hit_tokens"], stats["entries"]) == (1, 1, 3, 1)
    assert stats["bytes"] == entry_bytes(3)


def _nodes(cache: PrefixCache) -> int:
    stack, count = list(cache._roots.values()), 0
    while stack:
        node = stack.pop()
        count += 1
        stack.extend(node.children.values())
    return count


def test_the_trie_has_nodes_where_entries_sit_or_prompts_part_not_per_token():
    # A node per cached token made each token two objects the garbage collector walks on every full pass.
    cache = PrefixCache(1 << 30)
    shared = list(range(1, 301))
    prompts = [shared + [1000 + i] * 200 for i in range(10)]
    for p in prompts:
        cache.put("m", p, kv_for(p, layers=1))
    assert _nodes(cache) == 1 + 1 + 10  # root, the shared prefix's branch point, one leaf per prompt
    for i, p in enumerate(prompts):  # every entry still found, and a prompt parting inside an edge trims one
        n, kv = cache.take("m", p + [7])
        assert n == len(p) and contents(kv) == [p]
    n, kv = cache.take("m", shared[:150] + [5, 5])
    assert n == 150 and contents(kv) == [shared[:150]]


def test_removing_entries_folds_the_nodes_they_leave_behind():
    cache = PrefixCache(entry_bytes(12) + entry_bytes(8) - 1, probation_share=1.0)
    cache.put("m", list(range(1, 9)), kv_for(list(range(1, 9))))
    cache.put("m", list(range(1, 5)) + [50] * 4, kv_for(list(range(1, 5)) + [50] * 4))
    assert _nodes(cache) == 4  # root, the split at 4 tokens, two leaves
    cache.put("m", list(range(1, 13)), kv_for(list(range(1, 13))))  # evicts the LRU entry, dominates the first
    assert cache.stats()["entries"] == 1
    assert _nodes(cache) == 2  # root and the one entry: the split node folded away
    n, kv = cache.take("m", list(range(1, 13)) + [3])
    assert n == 12 and contents(kv) == [list(range(1, 13))] * LAYERS


def test_a_put_starts_its_copies_without_waiting_and_they_survive_later_writes(monkeypatch):
    import engine.prefix_cache as module

    def no_wait(*_arrays):
        raise AssertionError("a put waited for the device")

    monkeypatch.setattr(module.mx, "eval", no_wait)  # mid-step, the next step is in flight: never block
    cache = PrefixCache(1 << 20)
    live = kv_for([1, 2, 3])
    cache.put("m", [1, 2, 3], live)
    assert cache.stats()["bytes"] == entry_bytes(3)  # counted from the shapes, before the copies ran
    for layer in live:  # the live row writes on, in place where MLX can: the snapshot must not see it
        layer.keys[..., :1, :] = -1.0
        layer.values[..., :1, :] = -1.0
    monkeypatch.undo()
    n, kv = cache.take("m", [1, 2, 3, 4])
    assert (n, contents(kv)) == (3, [[1, 2, 3]] * LAYERS)


def on_another_thread(fn):
    """fn() on a fresh thread (as the prefill lane takes what the decode thread put); returns its result."""
    box = []
    thread = threading.Thread(target=lambda: box.append(fn()))
    thread.start()
    thread.join()
    return box[0]


def taken_on_another_thread(cache, prompt):
    """(n, contents) of a take on a fresh thread, read there: as the engine reads a hit on the thread that took it (its
    KV is built on that thread's stream)."""
    def take():
        n, kv = cache.take("m", prompt)
        return n, contents(kv) if kv is not None else None
    return on_another_thread(take)


def test_another_thread_takes_an_entry_only_once_the_thread_that_put_it_settled_it():
    # On CUDA each thread has its own MLX stream: an entry whose copies its thread started and never waited for
    # cannot be evaluated on by another thread, so that thread is handed the next shorter entry until then.
    cache = PrefixCache(1 << 20)
    cache.put("m", [1, 2], kv_for([1, 2]), system_prefix=True)
    assert cache.settle() == 1
    cache.put("m", [1, 2, 3, 4], kv_for([1, 2, 3, 4]))
    assert cache.has_pending()
    assert taken_on_another_thread(cache, [1, 2, 3, 4, 5]) == (2, [[1, 2]] * LAYERS)  # the settled shorter entry
    assert cache.take("m", [1, 2, 3, 4, 9])[0] == 4  # its own thread may take it at once
    assert on_another_thread(cache.settle) == 0  # only the thread that put it can settle it
    assert cache.settle() == 1 and not cache.has_pending()
    assert taken_on_another_thread(cache, [1, 2, 3, 4, 5]) == (4, [[1, 2, 3, 4]] * LAYERS)


def test_keep_latest_settles_a_put_one_call_later():
    # A pipelined engine thread settles its puts an iteration later, once the step their copies queued behind is read.
    cache = PrefixCache(1 << 20)
    cache.put("m", [1, 2, 3], kv_for([1, 2, 3]))
    assert cache.settle(keep_latest=True) == 0 and cache.has_pending()
    cache.put("m", [7, 8, 9], kv_for([7, 8, 9]))
    assert cache.settle(keep_latest=True) == 1  # [1, 2, 3]; [7, 8, 9] waits for the next call
    assert on_another_thread(lambda: cache.take("m", [1, 2, 3, 4]))[0] == 3
    assert on_another_thread(lambda: cache.take("m", [7, 8, 9, 4]))[0] == 0
    assert cache.settle() == 1 and not cache.has_pending()


def test_forks_of_one_prompt_hold_its_kv_once():
    # Eight conversations over one system prompt (agents, sub-agents, users of one server): the prompt's KV was
    # stored once per entry, 9 x 16 + 8 x 6 positions here; blocks of it are now shared.
    cache = PrefixCache(1 << 20, block_tokens=4)
    system = list(range(100, 116))
    cache.put("m", system, kv_for(system), system_prefix=True)
    forks = [system + [i] * 6 for i in range(1, 9)]
    for fork in forks:
        cache.put("m", fork, kv_for(fork))
    stats = cache.stats()
    assert stats["entries"] == 9 and stats["bytes"] == entry_bytes(16) + 8 * entry_bytes(6)
    assert stats["probation_bytes"] == 8 * entry_bytes(6)  # a fork is charged what its put added
    for fork in forks:
        n, kv = cache.take("m", fork + [7])
        assert (n, contents(kv)) == (22, [fork] * LAYERS)
    assert cache.take("m", system + [1, 1, 9])[0] == 18  # a longer fork trimmed inside a block
    assert contents(cache.take("m", system + [1, 1, 9])[1]) == [system + [1, 1]] * LAYERS


def test_an_evicted_fork_leaves_the_shared_blocks_to_the_others_and_the_last_frees_them():
    cache = PrefixCache(1 << 20, probation_share=1.0, block_tokens=4)
    prefix = list(range(100, 110))  # two whole blocks and two positions of a third
    forks = [prefix + [i] * 5 for i in range(1, 4)]
    for fork in forks:
        cache.put("m", fork, kv_for(fork))
    assert cache.stats()["bytes"] == entry_bytes(15) + 2 * entry_bytes(7)
    # The oldest fork's put copied the shared blocks with its own positions into one buffer per layer: evicting it
    # frees nothing while the others read that buffer, and the budget goes on counting all of it.
    cache.probation_max_bytes = 2 * entry_bytes(7)
    assert cache.reclaim() == 1
    stats = cache.stats()
    assert stats["entries"] == 2 and stats["probation_bytes"] == 2 * entry_bytes(7)
    assert stats["bytes"] == entry_bytes(15) + 2 * entry_bytes(7)
    assert stats["bytes"] == cache._store.buffer_bytes()
    assert cache.take("m", forks[0] + [9])[0] == 10  # the shared prefix, from the forks left
    for fork in forks[1:]:
        n, kv = cache.take("m", fork + [9])
        assert (n, contents(kv)) == (15, [fork] * LAYERS)
    cache.max_bytes = entry_bytes(15) + entry_bytes(7)  # the second fork's buffer backs no one else's blocks
    assert cache.reclaim() == 1
    assert cache.stats()["bytes"] == entry_bytes(15) + entry_bytes(7) == cache._store.buffer_bytes()
    assert cache._store.block_count() == 3
    n, kv = cache.take("m", forks[2] + [9])
    assert (n, contents(kv)) == (15, [forks[2]] * LAYERS)
    cache.clear()  # the last user of the first buffer
    assert cache.stats()["bytes"] == 0 == cache._store.buffer_bytes() and cache._store.block_count() == 0


def test_a_fork_on_blocks_another_threads_put_has_not_settled_waits_for_it():
    # Thread A's copies into new blocks run on its own stream: thread B's fork reusing them may be taken by B only
    # once A settled them, though B settled its own copies.
    cache = PrefixCache(1 << 20, block_tokens=4)
    prefix = list(range(100, 108))
    cache.put("m", prefix + [1, 1], kv_for(prefix + [1, 1]))
    fork = prefix + [2, 2, 2]

    def put_and_take():
        cache.put("m", fork, kv_for(fork))
        cache.settle()
        return cache.take("m", fork + [9])[0]

    assert on_another_thread(put_and_take) == 0
    cache.settle()
    assert on_another_thread(lambda: cache.take("m", fork + [9])[0]) == 11
