"""engine/rows.py prefill_shares: which prompts an iteration's prompt-token room goes to."""

from __future__ import annotations

from typing import Any

from hypothesis import given, strategies as st

from engine.rows import Row, prefill_shares


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


def test_rows_that_are_not_preparing_get_nothing() -> None:
    done = _row(5, prefilled=5)
    assert _shares([done, _row(20)], 8) == [0, 8]
    assert prefill_shares([_row(5)], 0) == []


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
