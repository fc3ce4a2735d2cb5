"""Admission control: LLMBatchGroup.submit refuses rows beyond max_queued with a typed QueueFull."""

from __future__ import annotations

import pytest

from engine.contracts import GenerationRequest, SamplingParams
from engine.errors import QueueFull
from tests.engine.test_batch import iterate, make_group, prompt_of

pytestmark = pytest.mark.anyio
GREEDY = SamplingParams(temperature=0.0)


async def test_rows_beyond_max_queued_are_refused_until_one_is_admitted(tiny_loaded) -> None:
    group = make_group(tiny_loaded, max_active=1, max_queued=2)
    first, second = (group.submit(GenerationRequest(prompt_of(4, i), GREEDY, max_tokens=2)) for i in range(2))
    with pytest.raises(QueueFull) as refused:
        group.submit(GenerationRequest(prompt_of(4, 3), GREEDY, max_tokens=2))
    assert (refused.value.queued, refused.value.limit) == (2, 2)
    await iterate(group)  # the first row is admitted: one place in the queue frees up
    assert (group.active_rows(), group.queued_rows()) == (1, 1)
    third = group.submit(GenerationRequest(prompt_of(4, 3), GREEDY, max_tokens=2))
    await second.aclose()  # a cancelled row no longer counts as waiting
    group.submit(GenerationRequest(prompt_of(4, 4), GREEDY, max_tokens=2))
    for stream in (first, third):
        await stream.aclose()


def test_no_limit_by_default_and_a_negative_limit_is_refused(tiny_loaded) -> None:
    group = make_group(tiny_loaded, max_active=1)
    streams = [group.submit(GenerationRequest(prompt_of(4, i), GREEDY, max_tokens=2)) for i in range(40)]
    assert group.queued_rows() == len(streams)
    with pytest.raises(ValueError, match="max_queued"):
        make_group(tiny_loaded, max_queued=-1)
