"""Serving statistics on synthetic data: percentiles, per-token ITL accounting, a scenario summary."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from bench.serve_stats import RequestResult, allocate_tokens, percentile, summarize, token_itls


def test_percentile_matches_numpy_linear() -> None:
    rng = random.Random(1)
    xs = [rng.expovariate(1.0) for _ in range(537)]
    for p in (0, 1, 50, 90, 99, 100):
        assert percentile(xs, p) == pytest.approx(float(np.percentile(xs, p)))
    assert math.isnan(percentile([], 50))
    assert percentile([3.0], 99) == 3.0


def test_allocate_tokens_scales_to_usage_total() -> None:
    # re-tokenized estimates 1,1,3,1 but the server says 10 tokens: the spare 6 follow the estimates beyond 1
    assert allocate_tokens([1, 1, 3, 1], 10) == [1, 1, 7, 1]
    assert sum(allocate_tokens([2, 5, 1, 4, 2], 31)) == 31
    assert all(x >= 1 for x in allocate_tokens([2, 5, 1, 4, 2], 31))
    # all ones and a larger total: shared evenly, remainders to the first chunks
    assert allocate_tokens([1, 1, 1], 7) == [3, 2, 2]
    # no usage, or a total below one per chunk: the estimates stand
    assert allocate_tokens([2, 3], None) == [2, 3]
    assert allocate_tokens([2, 3, 1], 2) == [2, 3, 1]


def test_token_itls_spreads_a_chunk_gap_over_its_tokens() -> None:
    times = [1.0, 1.1, 1.5, 1.6]
    tokens = [3, 1, 4, 1]  # the first chunk's 2 extra tokens came with the first: no ITL sample
    itls = token_itls(times, tokens)
    assert itls == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.1, 0.1])
    assert len(itls) == sum(tokens) - tokens[0]
    with pytest.raises(ValueError):
        token_itls([1.0], [1, 2])


def test_coalescing_server_has_the_same_itl_as_one_token_per_chunk() -> None:
    # the same token timeline (one token per 10 ms), sent one per chunk or four per chunk
    per_token = RequestResult(t_start=0.0, t_end=1.0, chunk_times=[0.1 + 0.01 * i for i in range(16)],
                              chunk_texts=["x"] * 16, completion_tokens=16)
    coalesced = RequestResult(t_start=0.0, t_end=1.0, chunk_times=[0.1, 0.14, 0.18, 0.22],
                              chunk_texts=["x", "xxxx", "xxxx", "xxxx"], completion_tokens=13)
    per_token.count_tokens(len)
    coalesced.count_tokens(len)
    a = summarize([per_token], 1.0)["itl_ms"]
    b = summarize([coalesced], 1.0)["itl_ms"]
    assert a["p50"] == pytest.approx(10.0) and b["p50"] == pytest.approx(10.0)
    assert coalesced.chunk_tokens == [1, 4, 4, 4]


def test_summary_counts_tokens_failures_and_latencies() -> None:
    ok = RequestResult(t_start=0.0, t_end=2.0, chunk_times=[0.5, 1.0, 1.5], chunk_texts=["a", "b", "c"],
                       completion_tokens=3, prompt_tokens=130)
    partial = RequestResult(t_start=0.0, t_end=3.0, chunk_times=[1.0, 1.2], chunk_texts=["a", "b"],
                            error="transport: ReadError")
    timeout = RequestResult(t_start=0.0, t_end=4.0, error="timeout: no full answer within 4 s (0 chunks)")
    unsent = RequestResult(t_start=4.0, t_end=4.0, not_sent=True)
    hung_up = RequestResult(t_start=0.0, t_end=0.7, chunk_times=[0.6], chunk_texts=["a"], disconnected=True)
    rs = [ok, partial, timeout, unsent, hung_up]
    for r in rs:
        r.count_tokens(len)
    s = summarize(rs, 4.0)
    assert s["requests"] == 5 and s["ok"] == 1 and s["disconnected"] == 1
    assert s["failed"] == 3
    assert s["failed_reasons"] == {"transport": 1, "timeout": 1, "not_sent": 1}
    assert s["output_tokens"] == 3 + 2 + 0 + 1  # every token delivered, also of failed requests
    assert s["tok_s"] == pytest.approx(6 / 4.0)
    assert s["mean_output_tokens"] == 3.0 and s["mean_prompt_tokens"] == 130.0
    assert s["ttft_ms"]["p50"] == pytest.approx(550.0)  # the answered one (500) and the hung-up one (600)
    assert s["itl_ms"]["max"] == pytest.approx(500.0)
    assert s["e2e_ms"]["p50"] == pytest.approx(2000.0)


def test_the_first_gap_of_each_stream_is_reported_apart() -> None:
    slow_start = RequestResult(t_start=0.0, t_end=1.0, chunk_times=[0.1, 0.4, 0.41, 0.42], chunk_texts=list("abcd"))
    steady = RequestResult(t_start=0.0, t_end=1.0, chunk_times=[0.2, 0.21, 0.22], chunk_texts=list("abc"))
    for r in (slow_start, steady):
        r.count_tokens(len)
    s = summarize([slow_start, steady], 1.0)
    assert s["itl_first_ms"]["max"] == pytest.approx(300.0)
    assert s["itl_first_ms"]["p50"] == pytest.approx(155.0)
    assert s["itl_later_ms"]["max"] == pytest.approx(10.0)
