"""audio/pacing.py: costs learnt from runs, and paced units and forwards sized to a time limit."""

from __future__ import annotations

import pytest

from audio.pacing import GRANULE, LinearCost, StepBudget, size_forward, size_unit


def test_a_cost_line_is_fitted_from_runs() -> None:
    cost = LinearCost()
    assert cost.predict(10) is None and cost.fits(1.0) is None
    for x in (64, 128, 64, 256, 128):
        cost.record(x, 0.002 + 0.0001 * x)
    assert cost.predict(100) == pytest.approx(0.012)
    assert cost.fits(0.012) == pytest.approx(100)


def test_runs_of_one_size_give_a_proportional_cost() -> None:
    cost = LinearCost()
    for _ in range(3):
        cost.record(64, 0.0064)
    assert cost.line() == (0.0, pytest.approx(0.0001))


def test_a_paced_unit_covers_whole_granules_that_fit() -> None:
    cost = LinearCost()
    for x in (64, 128, 256):
        cost.record(x, 0.0001 * x)
    windows = ["a", "b", "c"]
    # 0.04 s: 400 window-positions, 133 each for three windows → 128 positions each
    assert size_unit(cost, windows, True, 1500, 0.04, ran=False) == (windows, 128)
    assert size_unit(cost, windows, True, 1500, 0.0385, ran=True) == (windows, 128)
    # not one granule each for three (150 window-positions): one window alone gets 128
    assert size_unit(cost, windows, True, 1500, 0.015, ran=False) == (windows[:1], 128)
    # the stage's end cuts the unit
    assert size_unit(cost, windows, True, 92, 1.0, ran=False) == (windows, 92)
    # nothing fits: the smallest unit if the step did nothing yet, else the step ends
    assert size_unit(cost, windows, True, 1500, 0.001, ran=False) == (windows[:1], GRANULE)
    assert size_unit(cost, windows, True, 1500, 0.001, ran=True) is None


def test_fixed_units_stack_as_many_windows_as_fit() -> None:
    cost = LinearCost()
    cost.record(1, 0.01)
    cost.record(2, 0.02)
    assert size_unit(cost, [1, 2, 3], False, 0, 0.025, ran=False) == ([1, 2], 0)
    assert size_unit(cost, [1, 2, 3], False, 0, 0.005, ran=True) is None
    assert size_unit(LinearCost(), [1, 2, 3], False, 0, 0.005, ran=False) == ([1], 0)  # unmeasured: one


def test_a_paced_forward_takes_sampling_rows_then_prompt_chunks() -> None:
    cost = LinearCost()
    for x in (1, 4, 16):
        cost.record(x, 0.01 + 0.001 * x)
    unfed = {"a": 1, "b": 1, "c": 40, "d": 1}
    # 0.0305 s fits 20 tokens: the three sampling rows, and 17 prompt tokens for the feeding row
    assert size_forward(cost, list(unfed), unfed.__getitem__, 0.0305, ran=False) == (["a", "b", "d", "c"], 17)
    # 0.012 s fits two tokens: two sampling rows
    assert size_forward(cost, list(unfed), unfed.__getitem__, 0.012, ran=False) == (["a", "b"], 8)
    assert size_forward(cost, list(unfed), unfed.__getitem__, 0.001, ran=True) is None
    assert size_forward(cost, list(unfed), unfed.__getitem__, 0.001, ran=False) == (["a"], 8)


def test_a_step_share_doubles_per_catch_up_span_waited_up_to_8x() -> None:
    budget = StepBudget(chat_share=0.3, catch_up_seconds=1.0)
    assert budget.share(0.0) == pytest.approx(0.3)
    assert budget.share(1.0) == pytest.approx(0.6) and budget.share(2.0) == pytest.approx(1.2)
    assert budget.share(30.0) == pytest.approx(2.4)  # 8x at most
    assert StepBudget(catch_up_seconds=2.0).share(1.0) == pytest.approx(0.3 * 2 ** 0.5)


def test_budgets_are_checked() -> None:
    with pytest.raises(ValueError):
        StepBudget(catch_up_seconds=0)
    with pytest.raises(ValueError):
        StepBudget(chat_share=0)
    with pytest.raises(ValueError):
        StepBudget(decode_tokens=0)
