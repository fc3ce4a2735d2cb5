"""Admission control: LLMBatchGroup.submit refuses rows beyond max_queued with a typed QueueFull."""

from __future__ import annotations

import pytest

from engine.contracts import GenerationRequest, SamplingParams
from engine.errors import EngineClosed, QueueFull
from tests.engine.test_batch import drain, iterate, make_group, prompt_of

pytestmark = pytest.mark.anyio
GREEDY = SamplingParams(temperature=0.0)


async def test_rows_beyond_max_queued_are_refused_until_one_is_admitted(tiny_loaded) -> None:
    group = make_group(tiny_loaded, max_active=1, max_queued=2)
    # The first takes the free row at the next pass; two more may wait for it.
    first, second, third = (group.submit(GenerationRequest(prompt_of(4, i), GREEDY, max_tokens=2)) for i in range(3))
    with pytest.raises(QueueFull) as refused:
        group.submit(GenerationRequest(prompt_of(4, 3), GREEDY, max_tokens=2))
    assert (refused.value.queued, refused.value.limit) == (2, 2)
    await iterate(group)  # the first row is admitted: the other two still wait
    assert (group.active_rows(), group.queued_rows()) == (1, 2)
    with pytest.raises(QueueFull):
        group.submit(GenerationRequest(prompt_of(4, 3), GREEDY, max_tokens=2))
    await second.aclose()  # a cancelled row no longer counts as waiting
    fourth = group.submit(GenerationRequest(prompt_of(4, 4), GREEDY, max_tokens=2))
    for stream in (first, third, fourth):
        await stream.aclose()


async def test_no_queue_serves_an_idle_engine_and_refuses_only_while_every_row_is_busy(tiny_loaded) -> None:
    # max_queued 0 once refused even the one request of an idle server (it counted itself as waiting).
    group = make_group(tiny_loaded, max_active=1, max_queued=0)
    first = group.submit(GenerationRequest(prompt_of(4, 1), GREEDY, max_tokens=2))
    with pytest.raises(QueueFull):
        group.submit(GenerationRequest(prompt_of(4, 2), GREEDY, max_tokens=2))
    await iterate(group)
    with pytest.raises(QueueFull):  # its row is busy
        group.submit(GenerationRequest(prompt_of(4, 2), GREEDY, max_tokens=2))
    await first.aclose()
    await iterate(group)
    second = group.submit(GenerationRequest(prompt_of(4, 2), GREEDY, max_tokens=2))  # the row is free again
    await second.aclose()


def test_no_limit_by_default_and_a_negative_limit_is_refused(tiny_loaded) -> None:
    group = make_group(tiny_loaded, max_active=1)
    streams = [group.submit(GenerationRequest(prompt_of(4, i), GREEDY, max_tokens=2)) for i in range(40)]
    assert group.queued_rows() == len(streams)
    with pytest.raises(ValueError, match="max_queued"):
        make_group(tiny_loaded, max_queued=-1)


async def test_rows_the_kv_budget_keeps_waiting_count_as_waiting(tiny_loaded) -> None:
    # Four free rows but KV for one: free rows were counted as taking queued requests, so 9 waited under a limit of 6.
    group = make_group(tiny_loaded, max_active=4, max_queued=2, max_kv_tokens=30)
    streams = [group.submit(GenerationRequest(prompt_of(4, i), GREEDY, max_tokens=20)) for i in range(3)]
    with pytest.raises(QueueFull) as refused:
        group.submit(GenerationRequest(prompt_of(4, 3), GREEDY, max_tokens=20))
    assert (refused.value.queued, refused.value.limit) == (2, 2)
    await iterate(group)
    assert (group.active_rows(), group.queued_rows()) == (1, 2)
    for stream in streams:
        await stream.aclose()


async def test_refusing_the_queue_ends_waiting_rows_and_new_ones_while_running_rows_finish(tiny_loaded) -> None:
    # On shutdown, queued requests waited out the whole grace period for the 503 they were always going to get.
    group = make_group(tiny_loaded, max_active=1)
    running = group.submit(GenerationRequest(prompt_of(4, 0), GREEDY, max_tokens=3))
    await iterate(group)
    waiting = group.submit(GenerationRequest(prompt_of(4, 1), GREEDY, max_tokens=3))
    assert group.refuse_queued() == 1
    assert [d.finish_reason for d in drain(waiting)] == ["cancelled"]
    with pytest.raises(EngineClosed):
        group.submit(GenerationRequest(prompt_of(4, 2), GREEDY, max_tokens=3))
    got: list = []
    while not got or got[-1].finish_reason is None:
        await iterate(group)
        got += drain(running)
    assert got[-1].finish_reason == "length" and sum(len(d.token_ids) for d in got) == 3
