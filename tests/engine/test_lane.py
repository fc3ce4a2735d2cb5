"""engine/lane.py's DecodeFirst: while the decode thread builds a step, the prefill lane waits at its next layer
instead of taking turns with it on the GIL; its wait is capped, so the lane always goes on."""

from __future__ import annotations

import threading
from typing import Any, Iterator

import mlx.core as mx
import pytest

from engine.context import EngineThread
from engine.contracts import GenerationRequest
from engine.lane import DecodeFirst
from engine.rows import AGED
from engine.runner import Segment, make_cache
from tests.engine.test_batch import GREEDY, iterate, make_group, prompt_of

pytestmark = pytest.mark.anyio


def on_thread(thread: EngineThread, fn: Any) -> tuple[threading.Event, list[Any]]:
    """Submit fn to `thread`; returns (done, box): box holds (result, error) once done is set."""
    done, box = threading.Event(), []

    def landed(result: Any, error: BaseException | None) -> None:
        box.extend((result, error))
        done.set()

    thread.submit(fn, landed)
    return done, box


@pytest.fixture
def lane() -> Iterator[EngineThread]:
    thread = EngineThread("test-lane")
    yield thread
    thread.close()


def test_the_lane_waits_while_decode_builds_and_goes_on_after(lane: EngineThread) -> None:
    turns = DecodeFirst(lane, patience=30.0)
    with turns.decoding():  # this thread is the decode thread, mid-build
        done, _ = on_thread(lane, turns.yield_to_decode)
        assert turns.waiting.wait(30), "the lane never waited for the decode build"
        assert not done.is_set()  # still held: it goes on only once the build ends
    assert done.wait(30)
    assert turns.waits == 1
    done, _ = on_thread(lane, turns.yield_to_decode)  # no build now: no wait
    assert done.wait(30) and turns.waits == 1


def test_a_decode_thread_that_never_stops_building_does_not_starve_the_lane(lane: EngineThread) -> None:
    turns = DecodeFirst(lane, patience=0.001)
    with turns.decoding():
        done, _ = on_thread(lane, lambda: [turns.yield_to_decode() for _ in range(3)])
        assert done.wait(30)  # each wait ends at its cap while the build goes on
    assert turns.waits == 3


def test_decoding_on_the_lane_itself_marks_no_build(lane: EngineThread) -> None:
    turns = DecodeFirst(lane, patience=30.0)

    def lane_forward_then_yield() -> None:
        with turns.decoding():  # the lane's own forward: not a decode build
            turns.yield_to_decode()

    done, box = on_thread(lane, lane_forward_then_yield)
    assert done.wait(30) and box[1] is None and turns.waits == 0


async def test_a_lane_forward_waits_at_a_layer_while_a_decode_step_builds(tiny_loaded) -> None:
    group = make_group(tiny_loaded, prefill_lane=True)
    assert group.lane is not None
    runner, turns = group.step.runner.inner, group.lane.turns
    assert runner.turns is turns  # the group hands its runner the lane's turns
    turns.patience = 30.0
    prompt = prompt_of(12, 2)

    def prefill() -> list[float]:  # evaluated on the thread that built it
        logits = runner.forward([Segment(prompt, make_cache(tiny_loaded.model), True)])
        mx.eval(logits)
        return logits.tolist()

    expected = prefill()
    try:
        with turns.decoding():
            done, box = on_thread(group.lane.thread, prefill)
            assert turns.waiting.wait(30), "the lane's forward never waited at a layer"
            assert not done.is_set()
        assert done.wait(30) and box[1] is None
        assert box[0] == expected  # the same forward, only later
        assert turns.waits >= 1
    finally:
        group.close()


@pytest.mark.anyio
@pytest.mark.parametrize("lane", [False, True])
async def test_a_prompt_passed_over_ages_and_goes_first_with_and_without_the_lane(tiny_loaded, lane: bool) -> None:
    # The lane plans a job only for the rows `feed` gave a share: counted in the job's plan alone, a row left out
    # never aged, and on a GPU (the lane's default) a stream of short prompts still kept a long one waiting.
    group = make_group(tiny_loaded, prefill_lane=lane, max_iteration_tokens=2, minimum_preparation_tokens=1)
    try:
        streams = [group.submit(GenerationRequest(prompt_of(n, n), GREEDY, max_tokens=1)) for n in (120, 80, 60)]
        rows = [s._row for s in streams]  # the streams held: a dropped one cancels its row
        for _ in range(AGED + 4):
            await iterate(group)  # each iteration: one token for the oldest, one for the shortest (or the aged)
        oldest, passed, younger = rows
        assert passed.passed_over == AGED and passed.prefilled > 0  # aged, then read before the younger one
        assert (oldest.passed_over, younger.passed_over) == (0, 0)  # never overtaken by a younger prompt
    finally:
        group.close()
