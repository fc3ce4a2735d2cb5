"""engine/row_kv.py: a new row's cache is a prefix-cache hit or a fresh one; a departing row's KV goes to the prefix
cache cut to the tokens it fed, then its cache is freed; the record names what each call did; a cache that cannot be cut
back (a sliding window, a recurrent state) is also put at its system prompt's end and before its prompt's last token."""

from __future__ import annotations

import mlx.core as mx
import pytest

from engine.contracts import GenerationRequest, SamplingParams
from engine.prefix_cache import PrefixCache
from engine.row_kv import RowKV
from engine.rows import Row
from engine.runner import make_cache
from engine.step_record import StepRecord
from tests.engine.test_batch import (GREEDY, FakePrefixCache, assert_matches_reference, make_group, prompt_of,
                                    run_rows, tokens_of)


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


def sliding_llm(path):
    """A tiny llama whose first layer attends over a window of 8 (mlx-lm's RotatingKVCache), as gpt-oss's and Gemma's
    sliding layers do."""
    from tests.fixtures.tiny_llm import build_tiny_llm, load_tiny_llm

    return load_tiny_llm(build_tiny_llm(path, extra_config={"layer_types": ["sliding_attention", "full_attention"],
                                                            "sliding_window": 8}))


def hybrid_llm(path):
    """A tiny Qwen3.5: recurrent (linear-attention) layers beside a full-attention one."""
    from tests.fixtures.tiny_hybrid import build_tiny_qwen3_5
    from tests.fixtures.tiny_llm import load_tiny_llm

    return load_tiny_llm(build_tiny_qwen3_5(path))


def test_only_a_cache_that_cannot_be_cut_back_stops_its_prompt_chunks(tiny_loaded, tmp_path) -> None:
    sliding = sliding_llm(tmp_path)
    for loaded, prompt, max_tokens, stops in [
        (tiny_loaded, 30, 6, []),  # a plain KV cache: an entry of the whole reply serves any shorter prompt
        (sliding, 5, 2, []),  # its window never wraps
        (sliding, 5, 6, [4]),  # it wraps in the reply: an entry before the prompt's last token
        (sliding, 30, 6, [10, 29]),  # the system prompt's end too
    ]:
        kv = RowKV(loaded.model, None, PrefixCache(1 << 20), StepRecord)
        request = GenerationRequest(prompt_of(prompt, 1), GREEDY, max_tokens=max_tokens, segment_boundaries=(10,))
        row, _ = Row.start(request, request.prompt_tokens, vocab_size=400, tokenizer=loaded.tokenizer)
        kv.attach(row)
        assert row.stops == stops, (prompt, max_tokens)
    row, _ = Row.start(request, request.prompt_tokens, vocab_size=400, tokenizer=sliding.tokenizer)
    RowKV(sliding.model, None, None, StepRecord).attach(row)
    assert row.stops == []  # no prefix cache to put into


@pytest.mark.anyio
@pytest.mark.parametrize("build", [sliding_llm, hybrid_llm], ids=["sliding-window", "hybrid"])
async def test_a_repeated_prompt_and_a_next_turn_read_a_cache_that_cannot_be_cut_back(tmp_path, build) -> None:
    # gpt-oss or Gemma past their window, Qwen3-Next's or Qwen3.5's recurrent layers: the only entry was the whole
    # reply's, which neither a repeat of the prompt ("regenerate") nor a next turn whose template renders the reply
    # otherwise than it was generated reads: 0 cached tokens on every request, and no system-prompt entry either.
    loaded = build(tmp_path)
    cache = PrefixCache(1 << 24)
    group = make_group(loaded, prefix_cache=cache, max_iteration_tokens=16)

    def turn(prompt: list[int]) -> GenerationRequest:
        return GenerationRequest(prompt, GREEDY, max_tokens=6, segment_boundaries=(10,))

    async def cold(prompt: list[int]) -> list[int]:
        fresh = make_group(loaded, prefix_cache=PrefixCache(1 << 24), max_iteration_tokens=16)
        return tokens_of((await run_rows(fresh, [turn(prompt)], [0]))[0])

    prompt = prompt_of(30, 1)
    first = (await run_rows(group, [turn(prompt)], [0]))[0]
    again = (await run_rows(group, [turn(prompt)], [0]))[0]
    assert [d[-1].cached_tokens for d in (first, again)] == [0, 29]
    # Written: what a prompt sharing this one reads (not the reply's entry, which only a repeat of the reply reads).
    assert [d[-1].cache_write_tokens for d in (first, again)] == [29, 0]
    assert cache.stats()["system_entries"] == 1
    second = prompt + prompt_of(9, 2)  # the history re-rendered: not the tokens it generated
    later = (await run_rows(group, [turn(second)], [0]))[0]
    assert (later[-1].cached_tokens, later[-1].cache_write_tokens) == (29, 9)
    assert tokens_of(first) == tokens_of(again) == await cold(prompt)
    assert tokens_of(later) == await cold(second)
    assert_matches_reference(loaded, second, tokens_of(later), 6)
