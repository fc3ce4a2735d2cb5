"""engine/rows.py: prefill_shares (which prompts an iteration's prompt-token room goes to), and the ends Row.start
gives a row (vLLM's min_tokens and ignore_eos) run through a group beside rows without them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, strategies as st

from engine.contracts import GenerationRequest, SamplingParams
from engine.rows import AGED, Row, plan_iteration, prefill_shares
from tests.engine.test_batch import GREEDY, make_group, prompt_of, reference, run_rows, tokens_of


def _row(prompt: int, prefilled: int = 0) -> Row:
    row = Row(request=Any, send=Any, sampler=Any, stopper=Any, prompt=[1] * prompt)  # type: ignore[arg-type]
    row.prefilled = prefilled
    return row


def _shares(rows: list[Row], room: int) -> list[int]:
    got = dict((id(r), n) for r, n in prefill_shares(rows, room))
    return [got.get(id(r), 0) for r in rows]


def test_a_short_prompt_behind_a_long_one_is_read_at_once() -> None:
    assert _shares([_row(8000), _row(10)], 512) == [502, 10]


def test_short_prompts_share_half_the_room_and_the_oldest_keeps_the_other_half() -> None:
    assert _shares([_row(8000)] + [_row(100) for _ in range(5)], 512) == [256, 100, 100, 56, 0, 0]
    # Shortest first among them; equal needs by age.
    assert _shares([_row(8000), _row(200), _row(30), _row(30)], 100) == [50, 0, 30, 20]


def test_prompts_as_long_as_the_oldest_still_needs_wait_behind_it() -> None:
    assert _shares([_row(4000), _row(4000)], 512) == [512, 0]
    # The oldest needs 10: nobody is shorter, so it goes first and the rest follow oldest first.
    assert _shares([_row(4000, prefilled=3990), _row(300), _row(500)], 512) == [10, 300, 202]


def test_a_prompt_passed_over_long_enough_goes_before_shorter_ones() -> None:
    mid, short = _row(900), _row(100)
    assert _shares([_row(8000), mid, short], 100) == [50, 0, 50]
    mid.passed_over = AGED
    assert _shares([_row(8000), mid, short], 100) == [50, 50, 0]


def test_a_stream_of_short_prompts_never_keeps_an_older_one_waiting_for_good() -> None:
    # Eight agents: turns mostly cached (short prompts) kept coming, each shorter than the uncached first turns, which
    # waited ~390 s on a 2-core CPU while the oldest prompt took half of each iteration's few tokens.
    rows, fed = [_row(8000), _row(900)], 0
    for step in range(4 * AGED):
        rows.append(_row(10))  # a new short prompt every iteration
        for r, tokens, _ in plan_iteration(rows, 16, decode=False, prefill=True):
            r.prefilled += len(tokens)
        if rows[1].prefilled and not fed:
            fed = step
        rows = [r for r in rows if r.preparing]
    assert 0 < fed <= AGED + 1, fed


def test_two_equal_prompts_age_neither_and_the_oldest_is_read_as_fast_as_alone() -> None:
    # "Prompts as long as the oldest still wait behind it": aged after AGED iterations behind an equal prompt, the
    # second took half of every iteration, and the first's TTFT went from iteration 125 to 218.
    rows, done_at = [_row(8000), _row(8000)], {}
    for it in range(1, 400):
        for r, tokens, _ in plan_iteration(rows, 64, decode=False, prefill=True):
            r.prefilled += len(tokens)
        done_at.update((i, it) for i, r in enumerate(rows) if not r.preparing and i not in done_at)
    assert done_at == {0: 125, 1: 250}
    assert rows[1].passed_over == 0


def test_a_prompt_is_passed_over_only_when_a_younger_one_gets_tokens() -> None:
    oldest, waiting = _row(8000), _row(8000)
    for _ in range(3):
        prefill_shares([oldest, waiting], 64)  # in line behind an older prompt: not passed over
    assert waiting.passed_over == 0
    prefill_shares([oldest, waiting, _row(10)], 64)  # a younger, shorter one is read beside the oldest
    assert waiting.passed_over == 1
    older_short = _row(100)
    prefill_shares([oldest, older_short, waiting], 2)  # only older ones got tokens
    assert (waiting.passed_over, older_short.passed_over) == (1, 0)
    waiting.passed_over = AGED  # aged: goes before the shorter ones, and a younger one left out is in line behind it
    younger = _row(50)
    assert _shares([oldest, waiting, younger], 64) == [32, 32, 0] and younger.passed_over == 0


def test_rows_that_are_not_preparing_get_nothing() -> None:
    done = _row(5, prefilled=5)
    assert _shares([done, _row(20)], 8) == [0, 8]
    assert prefill_shares([_row(5)], 0) == []


def test_a_share_ends_at_the_rows_next_stop_and_the_room_left_goes_on() -> None:
    # A cache that cannot be cut back is put into the prefix cache only where a chunk ends (engine/row_kv.py).
    stopped = _row(100)
    stopped.stops = [10, 99]
    assert _shares([stopped, _row(300)], 512) == [10, 300]
    stopped.prefilled = 10
    assert _shares([stopped], 512) == [89]
    stopped.prefilled = 99
    assert _shares([stopped], 512) == [1]


@given(st.lists(st.tuples(st.integers(1, 3000), st.integers(0, 3000)), min_size=1, max_size=8),
       st.integers(1, 2048))
def test_the_room_is_used_and_never_exceeded_and_the_oldest_always_progresses(rows: list[tuple[int, int]],
                                                                              room: int) -> None:
    made = [_row(p, min(done, p - 1)) for p, done in rows]
    shares = prefill_shares(made, room)
    needs = [len(r.prompt) - r.prefilled for r in made]
    assert sum(n for _, n in shares) == min(room, sum(needs))  # nothing wasted while a prompt waits
    assert all(0 < n <= len(r.prompt) - r.prefilled for r, n in shares)
    assert len({id(r) for r, _ in shares}) == len(shares)
    assert shares[0][0] is made[0] and shares[0][1] >= min(needs[0], room // 2)


@pytest.mark.anyio
async def test_rows_with_and_without_min_tokens_and_ignore_eos_keep_their_own_ends(tiny_loaded) -> None:
    eos = tiny_loaded.tokenizer.eos_token_id
    prompt = prompt_of(6, 1)
    first = reference(tiny_loaded.model, prompt, 1)[0]  # greedy's first token: a stop token below
    ends_at_once = SamplingParams(temperature=0.0, logit_bias={eos: 100.0})  # the model writes its end first
    requests = [GenerationRequest(prompt, ends_at_once, max_tokens=6),
                GenerationRequest(prompt, ends_at_once, max_tokens=6, ignore_eos=True),
                GenerationRequest(prompt, ends_at_once, max_tokens=6, min_tokens=3),
                GenerationRequest(prompt, GREEDY, max_tokens=6, stop_token_ids=[first]),
                GenerationRequest(prompt, GREEDY, max_tokens=6, stop_token_ids=[first], min_tokens=2),
                GenerationRequest(prompt, ends_at_once, max_tokens=2, min_tokens=5)]  # a lowered max_tokens bounds it
    out = await run_rows(make_group(tiny_loaded), requests, [0] * len(requests))
    ends = [(d[-1].finish_reason, tokens_of(d), "".join(x.text for x in d)) for d in out.values()]
    assert ends[0] == ("stop", [eos], "")
    assert ends[1] == ("length", [eos] * 6, "")  # past every end to max_tokens; the ends write no text
    assert ends[2][0] == "stop" and ends[2][1][3] == eos and len(ends[2][1]) == 4 and eos not in ends[2][1][:3]
    assert ends[3][:2] == ("stop", [first])
    reason, held, _ = ends[4]  # a plain greedy row: its stop token held back for two draws, then free to end it
    assert first not in held[:2] and (reason == "length" or (reason == "stop" and held[-1] == first)), ends[4]
    assert ends[5][:2] == ("length", ends[2][1][:2])
