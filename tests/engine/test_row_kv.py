"""engine/row_kv.py: a new row's cache is a prefix-cache hit or a fresh one; a departing row's KV goes to the prefix
cache cut to the tokens it fed, then its cache is freed; the record names what each call did."""

from __future__ import annotations

import mlx.core as mx

from engine.contracts import GenerationRequest, SamplingParams
from engine.prefix_cache import PrefixCache
from engine.row_kv import RowKV
from engine.rows import Row
from engine.runner import make_cache
from engine.step_record import StepRecord
from tests.engine.test_batch import FakePrefixCache


def row_of(loaded, prompt: list[int]) -> Row:
    row, _ = Row.start(GenerationRequest(prompt, SamplingParams(temperature=0.0), max_tokens=4), prompt,
                       vocab_size=400, tokenizer=loaded.tokenizer)
    return row


def filled(loaded, n: int) -> list:
    cache = make_cache(loaded.model)
    for layer in cache:
        layer.update_and_fetch(mx.zeros((1, 2, n, 16)), mx.zeros((1, 2, n, 16)))
    return cache


def test_a_row_takes_a_prefix_hit_or_a_fresh_cache_and_leaves_its_fed_kv(tiny_loaded) -> None:
    prefix, record = FakePrefixCache(), StepRecord()
    kv = RowKV(tiny_loaded.model, None, prefix, lambda: record)
    record.begin(None)
    cold = row_of(tiny_loaded, [5, 6, 7, 8])
    kv.attach(cold)
    assert cold.prefilled == 0 and cold.cache is not None and cold.cache[0].offset == 0
    # The row fed its prompt and sampled two tokens: the KV holds the prompt and the first of them.
    cold.cache, cold.prefilled, cold.generated = filled(tiny_loaded, 5), 4, [9, 10]
    assert kv.keeps(cold)
    kv.put(cold)
    assert prefix.entries[0][0] == (5, 6, 7, 8, 9) and cold.cache is None and cold.slot is None
    assert cold.delta().cache_write_tokens == 4  # its whole prompt went into the cache (the sampled token is no part)
    warm = row_of(tiny_loaded, [5, 6, 7, 8, 9, 11, 12])
    kv.attach(warm)
    assert (warm.prefilled, warm.cached_tokens) == (5, 5) and prefix.entries == []
    warm.cache, warm.prefilled, warm.generated = filled(tiny_loaded, 7), 7, [13]
    kv.put(warm)
    assert warm.delta().cache_write_tokens == 2  # the prompt tokens past its hit
    again = row_of(tiny_loaded, [5, 6, 7, 8, 9, 11, 12])
    again.cache, again.prefilled, again.generated = filled(tiny_loaded, 7), 7, [13]
    prefix.put = lambda *args, **kw: range(0)  # type: ignore[method-assign]  # the cache held them already
    kv.put(again)
    assert again.delta().cache_write_tokens == 0
    events, _ = record.close(decode_rows=0, slots=None, waited=0.0)
    assert {"attach", "put"} <= events


def test_without_a_prefix_cache_a_row_leaves_nothing_behind(tiny_loaded) -> None:
    kv = RowKV(tiny_loaded.model, None, None, StepRecord)
    row = row_of(tiny_loaded, [1, 2, 3])
    kv.attach(row)
    row.prefilled = 3
    assert not kv.keeps(row)
    kv.put(row)
    assert row.cache is None


def test_a_seeded_sampled_row_prefills_its_whole_prompt(tiny_loaded) -> None:
    # A prefix hit changes the forward's shape and the logits' last bits: a seeded reply at temperature 1 changed on
    # an idle server with what the cache held (1 prompt in 8). Greedy and unseeded rows still take the hit.
    prefix = FakePrefixCache()
    kv = RowKV(tiny_loaded.model, None, prefix, StepRecord)
    for sampling, hit in [(SamplingParams(temperature=1.0, seed=5), 0), (SamplingParams(temperature=0.0, seed=5), 3),
                          (SamplingParams(temperature=1.0), 3)]:
        prefix.entries = [((5, 6, 7), filled(tiny_loaded, 3))]
        row, _ = Row.start(GenerationRequest([5, 6, 7, 8], sampling, max_tokens=4), [5, 6, 7, 8], vocab_size=400,
                           tokenizer=tiny_loaded.tokenizer)
        kv.attach(row)
        assert (row.prefilled, row.cached_tokens) == (hit, hit), sampling


def test_a_prompt_prefix_put_at_a_segment_boundary_is_the_rows_write_too(tiny_loaded) -> None:
    kv = RowKV(tiny_loaded.model, None, PrefixCache(1 << 20), StepRecord)
    request = GenerationRequest([5, 6, 7, 8], SamplingParams(temperature=0.0), max_tokens=4, segment_boundaries=(2,))
    row, _ = Row.start(request, [5, 6, 7, 8], vocab_size=400, tokenizer=tiny_loaded.tokenizer)
    row.cache, row.prefilled = filled(tiny_loaded, 3), 3  # its first chunk passed the boundary
    kv.boundary_puts(row, 0)
    assert row.delta().cache_write_tokens == 2
