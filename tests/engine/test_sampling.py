"""Per-row sampling (seed, penalties, logit_bias, filters) and stop matching (hold-back, UTF-8, limits)."""

from __future__ import annotations

import mlx.core as mx
import pytest

from engine.contracts import SamplingParams
from engine.sampling import RowSampler, sample_rows, validate_sampling

V = 16


def logits_with(values: dict[int, float]) -> mx.array:
    base = [0.0] * V
    for k, v in values.items():
        base[k] = v
    return mx.array([base])


def draws(sampler: RowSampler, logits: mx.array, n: int) -> list[int]:
    return [int(sampler.sample(logits).item()) for _ in range(n)]


def test_same_seed_reproduces_different_seed_differs() -> None:
    logits = mx.zeros((1, V))
    a = draws(RowSampler(SamplingParams(temperature=1.0, seed=7), [], V), logits, 20)
    # Global RNG use in between must not disturb a seeded row.
    mx.random.uniform(shape=(100,))
    b = draws(RowSampler(SamplingParams(temperature=1.0, seed=7), [], V), logits, 20)
    c = draws(RowSampler(SamplingParams(temperature=1.0, seed=8), [], V), logits, 20)
    assert a == b
    assert a != c
    assert len(set(a)) > 3  # it really samples


def test_temperature_zero_is_argmax() -> None:
    s = RowSampler(SamplingParams(temperature=0.0), [], V)
    assert s.plain_greedy
    assert draws(s, logits_with({5: 3.0, 6: 2.9}), 3) == [5, 5, 5]


def test_top_k_one_is_argmax_at_any_temperature() -> None:
    s = RowSampler(SamplingParams(temperature=5.0, top_k=1, seed=1), [], V)
    assert set(draws(s, logits_with({3: 1.0}), 20)) == {3}


def test_top_p_keeps_the_nucleus_only() -> None:
    s = RowSampler(SamplingParams(temperature=1.0, top_p=0.5, seed=3), [], V)
    assert set(draws(s, logits_with({2: 10.0, 4: 9.0}), 30)) == {2}


def test_min_p_drops_unlikely_tokens() -> None:
    s = RowSampler(SamplingParams(temperature=1.0, min_p=0.5, seed=3), [], V)
    assert set(draws(s, logits_with({2: 3.0, 4: 3.0}), 40)) == {2, 4}


def test_logit_bias_changes_the_choice() -> None:
    s = RowSampler(SamplingParams(temperature=0.0, logit_bias={9: 100.0}), [], V)
    assert not s.plain_greedy
    assert draws(s, logits_with({1: 5.0}), 1) == [9]


def test_repetition_penalty_covers_prompt_tokens() -> None:
    logits = logits_with({1: 2.0, 2: 1.5})
    assert draws(RowSampler(SamplingParams(temperature=0.0), [1], V), logits, 1) == [1]
    s = RowSampler(SamplingParams(temperature=0.0, repetition_penalty=2.0), [1], V)
    assert draws(s, logits, 1) == [2]  # 2.0 / 2 < 1.5


def test_presence_and_frequency_penalties_follow_generated_counts() -> None:
    logits = logits_with({1: 3.0, 2: 2.0})
    s = RowSampler(SamplingParams(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.4), [1], V)
    assert draws(s, logits, 1) == [1]  # prompt tokens are not penalised by presence/frequency
    s.accept(1)
    assert draws(s, logits, 1) == [1]  # 3.0 - 0.5 - 0.4 = 2.1 > 2.0
    s.accept(1)
    assert draws(s, logits, 1) == [2]  # 3.0 - 0.5 - 0.8 = 1.7 < 2.0


def test_sample_rows_mixes_greedy_and_biased_rows() -> None:
    logits = mx.concatenate([logits_with({1: 5.0}), logits_with({1: 5.0})])
    rows = [RowSampler(SamplingParams(temperature=0.0), [], V),
            RowSampler(SamplingParams(temperature=0.0, logit_bias={7: 50.0}), [], V)]
    assert sample_rows(logits, rows).tolist() == [1, 7]


def test_plain_rows_share_one_draw_whatever_their_number(monkeypatch) -> None:
    calls = []
    real = mx.random.categorical
    monkeypatch.setattr(mx.random, "categorical", lambda *a, **k: calls.append(1) or real(*a, **k))
    temps = [0.0, 0.7, 1.0, 0.0, 1.5, 0.3, 0.9, 0.0]
    logits = mx.concatenate([logits_with({i + 2: 80.0}) for i in range(len(temps))])
    rows = [RowSampler(SamplingParams(temperature=t), [], V) for t in temps]
    assert sample_rows(logits, rows).tolist() == [i + 2 for i in range(len(temps))]
    assert len(calls) == 1


def test_plain_and_processed_rows_keep_their_order(monkeypatch) -> None:
    calls = []
    real = mx.random.categorical
    monkeypatch.setattr(mx.random, "categorical", lambda *a, **k: calls.append(1) or real(*a, **k))
    logits = mx.concatenate([logits_with({i + 1: 80.0}) for i in range(5)])
    rows = [RowSampler(SamplingParams(temperature=1.0), [], V),
            RowSampler(SamplingParams(temperature=0.0, logit_bias={9: 500.0}), [], V),
            RowSampler(SamplingParams(temperature=0.0), [], V),
            RowSampler(SamplingParams(temperature=1.0, seed=3), [], V),
            RowSampler(SamplingParams(temperature=0.5), [], V)]
    assert sample_rows(logits, rows).tolist() == [1, 9, 3, 4, 5]
    assert len(calls) == 2  # the three plain rows together, the seeded row alone


def test_min_tokens_holds_a_rows_end_tokens_back_for_that_many_draws() -> None:
    # vLLM's MinTokensLogitsProcessor: the end-of-sequence and stop ids cannot be drawn before min_tokens.
    logits = logits_with({2: 50.0, 3: 40.0, 5: 30.0})
    row = RowSampler(SamplingParams(temperature=0.0), [], V, ends=[2, 3], min_tokens=2)
    assert [int(sample_rows(logits, [row]).item()) for _ in range(3)] == [5, 5, 2]
    sampled = RowSampler(SamplingParams(temperature=1.0), [], V, ends=[2, 3], min_tokens=1)
    assert [int(sample_rows(logits, [sampled]).item()) for _ in range(2)] == [5, 2]


def test_rows_with_and_without_min_tokens_keep_their_own_ends_and_their_shared_draw(monkeypatch) -> None:
    calls = []
    real = mx.random.categorical
    monkeypatch.setattr(mx.random, "categorical", lambda *a, **k: calls.append(1) or real(*a, **k))
    logits = mx.concatenate([logits_with({2: 80.0, 6: 40.0})] * 4)
    rows = [RowSampler(SamplingParams(temperature=0.0), [], V, ends=[2], min_tokens=1),
            RowSampler(SamplingParams(temperature=0.0), [], V),
            RowSampler(SamplingParams(temperature=1.0), [], V, ends=[2], min_tokens=2),
            RowSampler(SamplingParams(temperature=0.0, logit_bias={6: 1.0}), [], V, ends=[2], min_tokens=1)]
    assert [sample_rows(logits, rows).tolist() for _ in range(3)] == [[6, 2, 6, 6], [2, 2, 6, 2], [2, 2, 2, 2]]
    assert len(calls) == 3  # each step: the three plain rows in one draw, held or not; the biased row is greedy
    assert all(r.plain for r in rows[:3])


def test_a_held_rows_logprobs_are_the_raw_logits() -> None:
    # The held token is still the likeliest under the model: log probabilities are the raw logits' (vLLM's default).
    logits = mx.concatenate([logits_with({2: 5.0})] * 2)
    rows = [RowSampler(SamplingParams(temperature=0.0, logprobs=1), [], V, ends=[2], min_tokens=1),
            RowSampler(SamplingParams(temperature=0.0, logprobs=1, logit_bias={4: 1.0}), [], V, ends=[2], min_tokens=1)]
    tokens = sample_rows(logits, rows).tolist()
    assert tokens == [0, 4]
    for row, token in zip(rows, tokens):
        assert row.take_logprob(token).top[0][0] == 2


def test_logprobs_are_the_raw_logits_log_softmax_beside_any_sampling() -> None:
    logits = logits_with({2: 3.0, 5: 2.0, 7: 1.0})
    expected = logits[0] - mx.logsumexp(logits[0])
    # Temperature, bias and filters change the draw, never the reported distribution.
    s = RowSampler(SamplingParams(temperature=0.7, top_k=2, logit_bias={7: 50.0}, seed=1, logprobs=3), [], V)
    assert not s.plain and not s.pipelines  # samples alone, and is read before it samples again
    token = s.sample(logits)
    mx.eval(token, *s.arrays())
    got = s.take_logprob(int(token.item()))
    assert got is not None and got.token == 7  # the bias chose it
    assert got.logprob == pytest.approx(float(expected[7]), abs=1e-5)
    assert [t for t, _ in got.top] == [2, 5, 7]
    assert [v for _, v in got.top] == pytest.approx([float(expected[i]) for i in (2, 5, 7)], abs=1e-5)
    assert s.take_logprob(7) is None  # once per token


def test_logprobs_beside_a_repetition_penalty_are_the_raw_logits() -> None:
    # The penalty writes into the logits it penalises: into a copy, not the caller's, which the block reads.
    logits = logits_with({2: 3.0, 5: 2.0})
    expected = logits[0] - mx.logsumexp(logits[0])
    s = RowSampler(SamplingParams(temperature=0.0, repetition_penalty=10.0, logprobs=2), [2], V)
    got = s.take_logprob(int(s.sample(logits).item()))
    assert got is not None and got.token == 5  # the penalty turned the draw away from 2
    assert got.logprob == pytest.approx(float(expected[5]), abs=1e-5)
    assert [t for t, _ in got.top] == [2, 5]  # 2 is still the model's likeliest


def test_logprobs_zero_gives_the_token_only_and_k_past_the_vocabulary_gives_it_all() -> None:
    s = RowSampler(SamplingParams(temperature=0.0, logprobs=0), [], V)
    got = s.take_logprob(int(s.sample(logits_with({4: 2.0})).item()))
    assert got is not None and got.token == 4 and got.top == ()
    wide = RowSampler(SamplingParams(temperature=0.0, logprobs=20), [], V)
    got = wide.take_logprob(int(wide.sample(logits_with({4: 2.0})).item()))
    assert got is not None and len(got.top) == V and got.top[0][0] == 4
    plain = RowSampler(SamplingParams(temperature=0.0), [], V)
    assert plain.take_logprob(int(plain.sample(logits_with({4: 2.0})).item())) is None


def test_rows_sharing_a_draw_get_their_logprobs_from_one_set_of_ops(monkeypatch) -> None:
    # Greedy rows share one argmax whatever they ask; their log probabilities are computed together, each row's k
    # its own. Such a row still pipelines: its log probabilities queue beside its tokens.
    logits = mx.stack([logits_with({1: 2.0, 3: 1.0})[0], logits_with({5: 4.0, 6: 3.5, 7: 3.0})[0],
                       logits_with({9: 1.0})[0]])
    samplers = [RowSampler(SamplingParams(temperature=0.0, logprobs=k), [], V) for k in (2, 3, None)]
    assert all(s.plain_greedy for s in samplers) and all(s.pipelines for s in samplers)
    alone = []
    monkeypatch.setattr(RowSampler, "sample", lambda self, x, raw=None: alone.append(self) or mx.argmax(x, axis=-1))
    tokens = sample_rows(logits, samplers)
    mx.eval(tokens, *[a for s in samplers for a in s.arrays()])
    assert not alone and tokens.tolist() == [1, 5, 9]
    expected = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    first, second = samplers[0].take_logprob(1), samplers[1].take_logprob(5)
    assert first is not None and second is not None and samplers[2].take_logprob(9) is None
    assert [t for t, _ in first.top] == [1, 3] and [t for t, _ in second.top] == [5, 6, 7]
    assert first.logprob == pytest.approx(float(expected[0, 1]), abs=1e-5)
    assert [v for _, v in second.top] == pytest.approx([float(expected[1, i]) for i in (5, 6, 7)], abs=1e-5)
    # Beside a row that samples alone (a seeded one), the shared rows still get theirs.
    mixed = [RowSampler(SamplingParams(temperature=0.0, logprobs=1), [], V),
             RowSampler(SamplingParams(temperature=0.0, logprobs=0), [], V),
             RowSampler(SamplingParams(temperature=1.0, seed=4), [], V)]
    tokens = sample_rows(logits, mixed)
    assert len(alone) == 1 and alone[0] is mixed[2]
    got = mixed[0].take_logprob(int(tokens[0].item()))
    assert got is not None and got.top[0][0] == 1 and mixed[1].take_logprob(5) is not None


def test_a_row_that_samples_again_before_reading_gets_each_tokens_logprobs_in_order() -> None:
    # A pipelined row samples step N+1 before step N's token is read: the entries queue, oldest taken first.
    samplers = [RowSampler(SamplingParams(temperature=0.0, logprobs=1), [], V) for _ in range(2)]
    first = sample_rows(mx.stack([logits_with({2: 3.0})[0], logits_with({4: 3.0})[0]]), samplers)
    second = sample_rows(mx.stack([logits_with({6: 1.0})[0], logits_with({8: 5.0})[0]]), samplers)
    mx.eval(first, second, *[a for s in samplers for a in s.arrays()])
    firsts = [s.take_logprob(t) for s, t in zip(samplers, first.tolist())]
    seconds = [s.take_logprob(t) for s, t in zip(samplers, second.tolist())]
    assert [lp.token for lp in firsts if lp] == [2, 4] and [lp.token for lp in seconds if lp] == [6, 8]
    assert [lp.top[0][0] for lp in firsts + seconds if lp] == [2, 4, 6, 8]
    assert firsts[1] is not None and seconds[1] is not None and seconds[1].logprob > firsts[1].logprob
    assert samplers[0].take_logprob(6) is None and samplers[0].arrays() == []  # nothing left, nothing kept


def test_validate_sampling_rejects_out_of_range_values() -> None:
    for bad in (SamplingParams(temperature=-1), SamplingParams(top_p=0), SamplingParams(min_p=2),
                SamplingParams(repetition_penalty=0), SamplingParams(logit_bias={V: 1.0}),
                SamplingParams(logprobs=21), SamplingParams(logprobs=-1)):
        with pytest.raises(ValueError):
            validate_sampling(bad, V)
