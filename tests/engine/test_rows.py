"""engine/rows.py plan_iteration: decoding rows first, then prompt chunks; aligned chunk ends when asked."""

from __future__ import annotations

import pytest

from engine.contracts import GenerationRequest, SamplingParams
from engine.rows import Row, plan_iteration

pytestmark = pytest.mark.anyio


@pytest.fixture
def make_row(tiny_loaded):
    def make(prompt_len: int, prefilled: int = 0) -> Row:
        prompt = [5] * prompt_len
        request = GenerationRequest(prompt, SamplingParams(temperature=0.0), max_tokens=4)
        row, _ = Row.start(request, prompt, vocab_size=400, tokenizer=tiny_loaded.tokenizer)
        row.prefilled = prefilled
        return row

    return make


def _chunks(plan: list[tuple[Row, list[int], bool]]) -> list[int]:
    return [len(tokens) for _, tokens, _ in plan]


async def test_chunks_fill_the_budget_without_alignment(make_row) -> None:
    rows = [make_row(1000, prefilled=10), make_row(300)]
    assert _chunks(plan_iteration(rows, 512, decode=False, prefill=True)) == [512]


async def test_aligned_chunks_end_on_a_multiple_and_the_last_chunk_takes_the_rest(make_row) -> None:
    first, second = make_row(1000, prefilled=10), make_row(300)
    plan = plan_iteration([first, second], 512, decode=False, prefill=True, align=64)
    assert _chunks(plan) == [502, 10]  # the first ends at 512, a multiple; the 10 left go to the next row
    first.prefilled = 512
    assert _chunks(plan_iteration([first], 400, decode=False, prefill=True, align=64)) == [384]  # ends at 896
    first.prefilled = 896
    assert _chunks(plan_iteration([first], 400, decode=False, prefill=True, align=64)) == [104]  # the rest
    late = make_row(1000, prefilled=900)
    assert _chunks(plan_iteration([late], 40, decode=False, prefill=True, align=64)) == [40]  # no multiple in reach
