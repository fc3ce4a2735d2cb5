"""engine/prompt_scores.py through the group: a row asking for its prompt's log probabilities (what evaluation
harnesses score text by) gets, on its first delta, each prompt token's after those before it, equal to one direct
forward of mlx-lm's model over the whole prompt: across chunks and lm-head blocks, mixed beside decoding rows, on the
prefill lane, and with the prompt in the prefix cache (a hit would have skipped its positions)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest

from engine import prompt_scores
from engine.contracts import GenerationRequest, TokenLogprob
from engine.plan import SEPARATE_PASSES, ExecutionPlan
from tests.engine.test_batch import GREEDY, FakePrefixCache, make_group, prompt_of, run_rows, tokens_of

pytestmark = pytest.mark.anyio


def _direct(loaded: Any, prompt: list[int]) -> mx.array:
    """(positions, vocab) log probabilities of one forward over the whole prompt."""
    logits = loaded.model(mx.array([prompt]))[0].astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def _assert_direct(loaded: Any, prompt: list[int], got: list[TokenLogprob] | None, k: int) -> None:
    assert got is not None and [lp.token for lp in got] == prompt[1:]
    logp = _direct(loaded, prompt)
    for i, lp in enumerate(got):
        row = logp[i]  # position i predicts prompt token i + 1
        assert lp.logprob == pytest.approx(float(row[lp.token]), abs=2e-3)
        assert [t for t, _ in lp.top] == [int(t) for t in mx.argsort(-row)[:k].tolist()]
        assert [v for _, v in lp.top] == pytest.approx([float(row[t]) for t, _ in lp.top], abs=2e-3)


async def test_prompt_logprobs_equal_a_direct_forward_across_chunks_and_blocks(tiny_loaded, monkeypatch) -> None:
    monkeypatch.setattr(prompt_scores, "SPAN", 7)  # several lm-head blocks per chunk, one cut mid-chunk
    prompt = prompt_of(40, 3)
    mate = GenerationRequest(prompt_of(9, 1), GREEDY, max_tokens=30)
    group = make_group(tiny_loaded, max_iteration_tokens=16, minimum_preparation_tokens=4)
    deltas = await run_rows(group, [mate, GenerationRequest(prompt, GREEDY, max_tokens=3, prompt_logprobs=2)], [0, 2])
    assert any(group.step.runner.mixed)  # its chunks ran beside a decoding row
    scored = deltas[1]
    assert scored[0].prompt_logprobs is not None and all(d.prompt_logprobs is None for d in scored[1:])
    _assert_direct(tiny_loaded, prompt, scored[0].prompt_logprobs, 2)
    assert deltas[0][0].prompt_logprobs is None  # not asked
    alone = await run_rows(make_group(tiny_loaded), [GenerationRequest(prompt, GREEDY, max_tokens=3)], [0])
    assert tokens_of(scored) == tokens_of(alone[0])  # the reply is the one it would have been


async def test_prompt_logprobs_on_the_prefill_lane(tiny_loaded) -> None:
    prompt = prompt_of(30, 5)
    group = make_group(tiny_loaded, prefill_lane=True, max_iteration_tokens=8, minimum_preparation_tokens=4)
    deltas = await run_rows(group, [GenerationRequest(prompt, GREEDY, max_tokens=2, prompt_logprobs=0)], [0])
    _assert_direct(tiny_loaded, prompt, deltas[0][0].prompt_logprobs, 0)


async def test_a_prompt_in_the_prefix_cache_is_scored_whole(tiny_loaded) -> None:
    cache = FakePrefixCache()
    group = make_group(tiny_loaded, prefix_cache=cache)
    first = prompt_of(12, 7)
    reply = tokens_of((await run_rows(group, [GenerationRequest(first, GREEDY, max_tokens=2, namespace="m")],
                                      [0]))[0])
    prompt = first + reply + prompt_of(6, 8)  # a plain request would continue the cached KV of its first 13
    deltas = await run_rows(group, [GenerationRequest(prompt, GREEDY, max_tokens=2, namespace="m",
                                                      prompt_logprobs=1)], [0])
    assert deltas[0][-1].cached_tokens == 0
    _assert_direct(tiny_loaded, prompt, deltas[0][0].prompt_logprobs, 1)
    plain = await run_rows(group, [GenerationRequest(prompt, GREEDY, max_tokens=2, namespace="m")], [0])
    assert plain[0][-1].cached_tokens > 0


async def test_a_one_token_prompt_has_nothing_to_score(tiny_loaded) -> None:
    deltas = await run_rows(make_group(tiny_loaded), [GenerationRequest([5], GREEDY, max_tokens=2,
                                                                        prompt_logprobs=1)], [0])
    assert deltas[0][0].prompt_logprobs == []


async def test_prompt_logprobs_with_separate_passes(tiny_loaded, monkeypatch) -> None:
    monkeypatch.setattr(prompt_scores, "SPAN", 5)
    prompt = prompt_of(23, 9)
    group = make_group(tiny_loaded, max_iteration_tokens=16,
                       plan=ExecutionPlan(SEPARATE_PASSES, "mlx-cpu", (), ["forced for the test"]))
    deltas = await run_rows(group, [GenerationRequest(prompt, GREEDY, max_tokens=2, prompt_logprobs=3)], [0])
    _assert_direct(tiny_loaded, prompt, deltas[0][0].prompt_logprobs, 3)
