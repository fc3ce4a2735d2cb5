"""engine/penalty_window.py: mlx_lm.server's penalty windows give exactly the logits mlx-lm's processors do over the
last N tokens of prompt + reply; rows without a window keep OpenAI's penalties and pay nothing for the windows."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.sample_utils import make_logits_processors

from engine.contracts import SamplingParams
from engine.errors import InvalidSampling
from engine.penalty_window import MAX_WINDOW, PenaltyWindows
from engine.sampling import RowSampler, validate_sampling

V = 32
PROMPT = [3, 5, 5, 7, 11, 3, 13]
REPLY = [5, 17, 17, 3, 19]


def _mlx_lm(logits: mx.array, tokens: list[int], **settings: float | int) -> mx.array:
    """What mlx-lm's processors make of `logits` after `tokens` (prompt + reply), as generate_step calls them."""
    for processor in make_logits_processors(**settings):
        logits = processor(mx.array(tokens), logits)
    return logits


@pytest.mark.parametrize("size", [1, 3, 8, 0, MAX_WINDOW + 5])
@pytest.mark.parametrize("penalties", [
    {"repetition_penalty": 1.7}, {"presence_penalty": 0.6}, {"frequency_penalty": 0.45},
    {"repetition_penalty": 0.8, "presence_penalty": -0.5, "frequency_penalty": 1.25}])
def test_windowed_penalties_equal_mlx_lms_processors(penalties: dict[str, float], size: int) -> None:
    sizes = {f"{name.split('_')[0]}_context_size": size for name in penalties}
    windows = PenaltyWindows.of(SamplingParams(**penalties, **sizes), PROMPT)
    assert windows is not None
    logits = mx.random.normal((1, V), key=mx.random.key(4)) * 3
    reference = dict(penalties, **{k: (0 if v >= MAX_WINDOW else v) for k, v in sizes.items()})
    for n, token in enumerate([None, *REPLY]):
        if token is not None:
            windows.accept(token)
        seen = PROMPT + REPLY[:n]
        got, want = windows.apply(logits[:]), _mlx_lm(logits[:], seen, **reference)
        assert mx.array_equal(got, want).item(), (n, got, want)


def test_a_row_without_a_window_has_none_and_a_window_without_its_penalty_does_nothing() -> None:
    assert PenaltyWindows.of(SamplingParams(repetition_penalty=1.3, presence_penalty=0.5), PROMPT) is None
    assert PenaltyWindows.of(SamplingParams(repetition_context_size=4, frequency_context_size=2), PROMPT) is None


def test_the_sampler_penalises_only_the_window_and_keeps_openais_penalties_without_one() -> None:
    # Token 2, the likeliest, was last seen 4 tokens back: a window of 3 no longer penalises it, the whole prompt does.
    logits = mx.array([[0.0, 0.0, 4.0, 3.0] + [0.0] * (V - 4)])
    prompt = [2, 9, 9, 9]
    greedy = SamplingParams(temperature=0.0, repetition_penalty=100.0)
    assert RowSampler(greedy, prompt, V).sample(logits).item() == 3
    windowed = RowSampler(SamplingParams(temperature=0.0, repetition_penalty=100.0, repetition_context_size=3),
                          prompt, V)
    assert not windowed.plain_greedy
    assert windowed.sample(logits).item() == 2
    windowed.accept(2)  # now in the window
    assert windowed.sample(logits).item() == 3
    # A presence penalty with a window counts the prompt too (mlx-lm's); without one only the reply (OpenAI's).
    presence = {"temperature": 0.0, "presence_penalty": 2.0}
    assert RowSampler(SamplingParams(**presence), prompt, V).sample(logits).item() == 2
    within = RowSampler(SamplingParams(**presence, presence_context_size=4), prompt, V)
    assert within.sample(logits).item() == 3


def test_logprobs_beside_a_window_are_the_raw_logits() -> None:
    logits = mx.array([[0.0, 0.0, 4.0, 3.0] + [0.0] * (V - 4)])
    expected = logits[0] - mx.logsumexp(logits[0])
    s = RowSampler(SamplingParams(temperature=0.0, repetition_penalty=100.0, repetition_context_size=2, logprobs=1),
                   [2], V)
    got = s.take_logprob(int(s.sample(logits).item()))
    assert got is not None and got.token == 3 and got.top[0][0] == 2
    assert got.logprob == pytest.approx(float(expected[3]), abs=1e-5)


@pytest.mark.parametrize("name", ["repetition_context_size", "presence_context_size", "frequency_context_size"])
def test_a_negative_window_is_refused_by_name(name: str) -> None:
    with pytest.raises(InvalidSampling) as refused:
        validate_sampling(SamplingParams(**{name: -1}), V)
    assert refused.value.param == name
