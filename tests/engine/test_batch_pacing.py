"""Prefill pacing inside the batch group (engine/batch.py, engine/driver.py, engine/pacing.py): a fresh group, one
long prompt first, then a short one that decodes beside it. The pacer is fed costs in proportion to each iteration's
tokens instead of wall time, so the tests assert the order of iterations and the chunk sizes, never a duration."""

from __future__ import annotations

import pytest

from engine.contracts import GenerationRequest
from engine.pacing import REFRESH, STALL
from tests.engine.test_batch import GREEDY, drain, iterate, make_group, prompt_of

pytestmark = pytest.mark.anyio
DECODE = 0.080  # a decode step of the demo model on 2 cores
PER_TOKEN = 0.005  # what a prompt token adds beside it
FITS = int((STALL - 1) * DECODE / PER_TOKEN)  # prompt tokens a mixed iteration may carry within the bound


def priced(group) -> list[tuple[int, int]]:
    """Price each iteration the group records for its pacer from its tokens; returns the (prompt tokens, decoding
    rows) recorded, in order."""
    seen: list[tuple[int, int]] = []
    record = group.pacer.record

    def by_tokens(seconds: float, prompt_tokens: int, decode_rows: int) -> None:
        seen.append((prompt_tokens, decode_rows))
        record((DECODE if decode_rows else 0.0) + PER_TOKEN * prompt_tokens, prompt_tokens, decode_rows)

    group.pacer.record = by_tokens
    return seen


async def test_a_long_prompt_first_on_a_fresh_group_is_paced_from_a_measured_decode_step(tiny_loaded) -> None:
    # The probe's agents: A's 6,919-token prompt came first, then B's short one decoded beside it. No decode-only
    # iteration ever ran while A's prompt waited, so the chunks doubled unmeasured to the whole budget: B's gaps grew
    # to 19.7 s on a 2-core CPU and its 48 tokens took until A's prompt was done.
    group = make_group(tiny_loaded, max_iteration_tokens=32, minimum_preparation_tokens=2, keep_mixed_in_flight=False)
    seen = priced(group)
    long = group.submit(GenerationRequest(prompt_of(1900, 1), GREEDY, max_tokens=1))
    await iterate(group)  # A alone: the whole budget
    short = group.submit(GenerationRequest(prompt_of(3, 2), GREEDY, max_tokens=REFRESH + 24))
    for _ in range(REFRESH + 24):
        await iterate(group)
    beside = [n for n, rows in seen if rows]  # the prompt tokens of each iteration B decoded in
    assert beside[:2] == [0, 2]  # a decode step measures the bound, then the minimum prices the tokens
    assert all(n <= FITS for n in beside)  # no mixed iteration past the bound
    assert beside.count(FITS) >= REFRESH  # prompts still get what fits
    assert 0 in beside[2:2 + REFRESH + 1]  # and the decode cost is measured again while they wait
    assert not any(d.finish_reason for d in drain(long))  # A's prompt waited throughout: each iteration was mixable
    assert len([t for d in drain(short) for t in d.token_ids]) == 1 + len(beside)  # B's first token, then one each
