"""engine/xtc.py and XTC in the row sampler: mlx-lm's mask exactly, in mlx-lm's place among the filters, per row,
its coin drawn with a seeded row's own key."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p
from mlx_lm.sample_utils import apply_xtc as mlx_lm_xtc

from engine import sampling
from engine.contracts import SamplingParams
from engine.errors import InvalidSampling
from engine.sampling import RowSampler, sample_rows, validate_sampling
from engine.xtc import apply_xtc, xtc_special_tokens

V = 64


def _logprobs(seed: int, rows: int = 1) -> mx.array:
    x = mx.random.normal((rows, V), key=mx.random.key(seed)) * 2.5
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


@pytest.mark.parametrize("threshold", [0.0, 0.02, 0.1, 0.3, 0.5])
@pytest.mark.parametrize("special", [[], [7, 3]])
def test_the_mask_is_mlx_lms(threshold: float, special: list[int]) -> None:
    for seed in range(6):
        x = _logprobs(seed)
        if seed % 2:  # after another filter: tokens already dropped
            x = apply_min_p(x, 0.05)
        ids = mx.array(special) if special else None
        # Probability 1: always applied (mlx-lm's coin is `uniform > p`); 0: never.
        assert mx.array_equal(apply_xtc(x, 1.0, threshold, ids, None), mlx_lm_xtc(x, 1.0, threshold, special)).item()
        assert mx.array_equal(apply_xtc(x, 0.0, threshold, ids, mx.random.key(seed)), x).item()


def test_above_half_nothing_is_dropped_and_the_special_tokens_never_are() -> None:
    x = mx.log(mx.array([[0.6, 0.25, 0.15]]))
    assert mx.array_equal(apply_xtc(x, 1.0, 0.7, None, None), x).item()
    dropped = apply_xtc(x, 1.0, 0.2, None, None)
    assert dropped[0].tolist()[0] == -float("inf") and mx.isfinite(dropped[0, 1:]).all().item()
    assert mx.array_equal(apply_xtc(x, 1.0, 0.2, mx.array([0]), None), x).item()


def test_the_sampler_filters_as_mlx_lms_sampler_chain(monkeypatch) -> None:
    # top_p, min_p, XTC, top_k: make_sampler's order; at temperature 1 the distribution drawn from is the same.
    drawn: list[mx.array] = []
    categorical = mx.random.categorical
    monkeypatch.setattr(sampling.mx.random, "categorical", lambda x, **kw: drawn.append(x) or categorical(x, **kw))
    for seed in range(5):
        logits = mx.random.normal((1, V), key=mx.random.key(100 + seed)) * 3
        params = SamplingParams(temperature=1.0, top_p=0.95, min_p=0.02, top_k=12, xtc_probability=1.0,
                                xtc_threshold=0.05, seed=seed)
        RowSampler(params, [], V, xtc_special=[5]).sample(logits)
        x = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        x = apply_top_k(mlx_lm_xtc(apply_min_p(apply_top_p(x, 0.95), 0.02), 1.0, 0.05, [5]), 12)
        assert mx.array_equal(mx.isinf(drawn[-1]), mx.isinf(x)).item()
        assert mx.allclose(mx.where(mx.isinf(x), 0, drawn[-1]), mx.where(mx.isinf(x), 0, x), atol=1e-5).item()


def _draws(sampler: RowSampler, logits: mx.array, n: int) -> list[int]:
    return [int(sampler.sample(logits).item()) for _ in range(n)]


def test_xtc_never_draws_the_top_choices_and_a_seeded_row_repeats() -> None:
    logits = mx.log(mx.array([[0.4, 0.3, 0.2, 0.1] + [1e-9] * (V - 4)]))
    always = RowSampler(SamplingParams(temperature=1.0, xtc_probability=1.0, xtc_threshold=0.15, seed=1), [], V)
    assert not always.plain
    assert set(_draws(always, logits, 40)) == {2, 3}  # 0 and 1 dropped, 2 the least likely above 0.15 kept
    half = SamplingParams(temperature=1.0, xtc_probability=0.5, xtc_threshold=0.15, seed=9)
    a = _draws(RowSampler(half, [], V), logits, 40)
    mx.random.uniform(shape=(10,))  # the global generator moved: a seeded row's coin is its own
    assert a == _draws(RowSampler(half, [], V), logits, 40)
    assert {0, 1} & set(a) and {2, 3} & set(a)  # some draws kept the top choices, some not
    # Greedy ignores XTC (as mlx-lm's greedy sampler).
    assert _draws(RowSampler(SamplingParams(temperature=0.0, xtc_probability=1.0), [], V), logits, 3) == [0, 0, 0]


def test_batched_rows_keep_their_own_xtc_settings() -> None:
    logits = mx.concatenate([mx.log(mx.array([[0.4, 0.3, 0.2, 0.1] + [1e-9] * (V - 4)]))] * 4)
    settings = [SamplingParams(temperature=1.0, xtc_probability=1.0, xtc_threshold=0.15, seed=3),
                SamplingParams(temperature=0.0),
                SamplingParams(temperature=1.0, xtc_probability=1.0, xtc_threshold=0.25, seed=4),
                SamplingParams(temperature=1.0, seed=5)]
    batch = [RowSampler(p, [], V) for p in settings]
    alone = [RowSampler(p, [], V) for p in settings]
    rows = [sample_rows(logits, batch).tolist() for _ in range(30)]
    for i, sampler in enumerate(alone):
        assert [r[i] for r in rows] == _draws(sampler, logits[i : i + 1], 30)
    assert {r[0] for r in rows} == {2, 3} and {r[2] for r in rows} == {1, 2, 3} and {r[1] for r in rows} == {0}


@pytest.mark.parametrize("name, value", [("xtc_probability", 1.5), ("xtc_probability", -0.1), ("xtc_threshold", 2.0)])
def test_out_of_range_settings_are_refused_by_name(name: str, value: float) -> None:
    with pytest.raises(InvalidSampling) as refused:
        validate_sampling(SamplingParams(**{name: value}), V)  # type: ignore[arg-type]
    assert refused.value.param == name


@pytest.mark.parametrize("temperature, probability, threshold, refused", [
    (0.7, 0.5, 0.6, True), (0.7, 1.0, 1.0, True),  # mlx_lm.sample_utils.apply_xtc raises: only [0, 0.5]
    (0.7, 0.5, 0.5, False),
    (0.0, 1.0, 0.6, False),  # greedy: mlx-lm's greedy sampler never builds XTC, its server takes up to 1
    (0.7, 0.0, 0.9, False),  # probability 0: never applied, as there
])
def test_a_threshold_above_half_is_refused_where_xtc_applies_as_mlx_lm(temperature: float, probability: float,
                                                                       threshold: float, refused: bool) -> None:
    params = SamplingParams(temperature=temperature, xtc_probability=probability, xtc_threshold=threshold)
    if not refused:
        validate_sampling(params, V)
        return
    with pytest.raises(InvalidSampling) as error:
        validate_sampling(params, V)
    assert error.value.param == "xtc_threshold" and "[0, 0.5]" in str(error.value)
    # mlx-lm's apply_xtc is compiled over the global random state: raising mid-trace leaves a tracer there, which
    # fails the next evaluation of mx.random.state (a later test's engine step), so the state is seeded afresh.
    try:
        with pytest.raises(ValueError, match="0.5"):  # what mlx-lm's own sampler does with it
            mlx_lm_xtc(_logprobs(0), probability, threshold, [])
    finally:
        mx.random.seed(0)
    mx.eval(mx.random.state)  # usable again


def test_the_special_tokens_are_mlx_lm_servers(tiny_loaded) -> None:
    tokenizer = tiny_loaded.tokenizer
    special = xtc_special_tokens(tokenizer)
    assert list(special) == tokenizer.encode("\n") + sorted(tokenizer.eos_token_ids)
    assert xtc_special_tokens(tokenizer) is special  # once per tokenizer
