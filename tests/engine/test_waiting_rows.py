"""WaitingRows on its own: the queue limit counts only requests that really wait, a request's choices as one;
admission takes rows in order."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from engine.errors import QueueFull
from engine.rows import RowState
from engine.waiting_rows import WaitingRows


def row(prompt: int = 4, max_tokens: int = 4, cancelled: bool = False, finished: bool = False, choice: int = 0,
        name: str = "", origin: str | None = None) -> Any:
    request = SimpleNamespace(max_tokens=max_tokens, choice=choice, origin=origin)
    return SimpleNamespace(prompt=[0] * prompt, request=request, cancelled=cancelled, state=RowState.QUEUED,
                           finished=finished, name=name)


NEW = row().request  # a new single-choice request


def test_the_limit_counts_neither_rows_the_next_pass_takes_nor_a_newcomer_a_free_row_is_left_for() -> None:
    waiting = WaitingRows(max_active=2, max_queued=1, max_kv_tokens=None, admission=None)
    active: list[Any] = []
    for _ in range(2):  # both take the free rows at the next pass
        waiting.check_room(active, NEW)
        waiting.append(row())
    waiting.check_room(active, NEW)  # one may wait beyond them
    waiting.append(row())
    with pytest.raises(QueueFull) as refused:
        waiting.check_room(active, NEW)
    assert (refused.value.queued, refused.value.limit) == (1, 1)


def test_a_finished_row_whose_step_has_not_landed_leaves_room() -> None:
    # --max-queued 0, one row: the next request of a client that waited for the last reply was a 429.
    waiting = WaitingRows(max_active=1, max_queued=0, max_kv_tokens=None, admission=None)
    waiting.check_room([row(finished=True)], NEW)
    with pytest.raises(QueueFull):
        waiting.check_room([row()], NEW)


def test_a_kv_limit_keeps_rows_waiting_and_they_count() -> None:
    waiting = WaitingRows(max_active=4, max_queued=1, max_kv_tokens=30, admission=None)
    active: list[Any] = []
    for _ in range(2):  # 4 + 20 each: the second does not fit beside the first
        waiting.append(row(max_tokens=20))
    with pytest.raises(QueueFull):
        waiting.check_room(active, NEW)
    waiting.admit(active)
    assert len(active) == 1 and active[0].state is RowState.ACTIVE and waiting.count() == 1


def test_admission_keeps_order_passes_over_cancelled_rows_and_stops_at_max_active() -> None:
    waiting = WaitingRows(max_active=2, max_queued=None, max_kv_tokens=None, admission=None)
    first, gone, second, third = row(), row(cancelled=True), row(), row()
    for r in (first, gone, second, third):
        waiting.append(r)
    assert waiting.count() == 3 and len(waiting) == 4
    active: list[Any] = []
    waiting.admit(active)
    assert active == [first, second]
    assert waiting.drop_cancelled() == [gone]
    assert list(waiting) == [third] and not waiting.room_to_join(active)
    assert waiting.take_all() == [third] and waiting.count() == 0


def test_no_limit_queues_everything_and_a_negative_limit_is_refused() -> None:
    waiting = WaitingRows(max_active=1, max_queued=None, max_kv_tokens=None, admission=None)
    for _ in range(50):
        waiting.check_room([], NEW)
        waiting.append(row())
    with pytest.raises(ValueError, match="max_queued"):
        WaitingRows(max_active=1, max_queued=-1, max_kv_tokens=None, admission=None)


def test_a_request_s_later_choices_wait_behind_other_requests_earlier_ones() -> None:
    # A 64-choice request queued 48 rows ahead of a chat that came after it (34 s to its first token): its later
    # choices now take turns with other requests', each request's first in arrival order.
    waiting = WaitingRows(max_active=1, max_queued=None, max_kv_tokens=None, admission=None)
    for j in range(4):
        waiting.append(row(choice=j, name=f"A{j}"))
    waiting.append(row(name="C"))
    for j in range(3):
        waiting.append(row(choice=j, name=f"B{j}"))
    waiting.append(row(name="D"))
    assert [r.name for r in waiting] == ["A0", "C", "B0", "D", "A1", "B1", "A2", "B2", "A3"]
    active: list[Any] = []
    waiting.admit(active)
    assert [r.name for r in active] == ["A0"]


def _submit(waiting: WaitingRows, active: list[Any], origin: str, n: int) -> None:
    """A request of `n` choices, as the service submits one: each choice checked, then queued."""
    for j in range(n):
        choice = row(choice=j, origin=origin, name=f"{origin}{j}")
        waiting.check_room(active, choice.request)
        waiting.append(choice)


def test_a_request_s_choices_hold_one_place_while_its_first_runs_and_later_ones_wait() -> None:
    # --max-active 4 --max-queued 8: one n = 12 chat's 8 waiting choices took every place, so every other client got
    # 429 ("8 replies are already waiting") until it ended. Its choices are one request, whichever of them run.
    waiting = WaitingRows(max_active=4, max_queued=8, max_kv_tokens=None, admission=None)
    active: list[Any] = []
    _submit(waiting, active, "A", 12)
    waiting.admit(active)
    assert [r.name for r in active] == ["A0", "A1", "A2", "A3"] and waiting.count() == 8
    waiting.check_room(active, NEW)  # another client is queued, not refused
    other = row(name="B")
    waiting.append(other)
    assert [r.name for r in waiting][:2] == ["B", "A4"]  # and served before the n-request's later choices
    # Many n-requests still meet the limit once --max-queued requests wait: A (its first running) and B count.
    for origin in "CDEFGH":
        _submit(waiting, active, origin, 12)
    with pytest.raises(QueueFull) as refused:
        waiting.check_room(active, row(origin="I").request)
    assert (refused.value.queued, refused.value.limit) == (8, 8)
    assert str(refused.value).startswith("8 requests are already waiting for a row (limit 8)")
    waiting.check_room(active, row(choice=3, origin="H").request)  # a later choice is never refused: its first was in


def test_a_request_whose_rows_all_run_waits_no_more() -> None:
    waiting = WaitingRows(max_active=4, max_queued=0, max_kv_tokens=None, admission=None)
    active: list[Any] = []
    _submit(waiting, active, "A", 3)  # all three take free rows at the next pass, one row still free
    waiting.check_room(active, NEW)
    _submit(waiting, active, "B", 2)  # B0 takes the last row; B1 waits, and B with it
    with pytest.raises(QueueFull):
        waiting.check_room(active, NEW)
