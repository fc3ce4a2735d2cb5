"""engine/step_record.py: a step's named events (some found by comparing with its start) and its phases."""

from __future__ import annotations

import gc
import time
from types import SimpleNamespace

from engine.step_record import LanePhases, StepRecord


def test_a_step_names_what_it_did_and_splits_its_time() -> None:
    slots = SimpleNamespace(slots=4, capacity=256)
    record = StepRecord()
    record.begin(slots)
    record.note("put")
    t = record.tick("forward", time.perf_counter() - 0.002)
    record.tick("forward", t - 0.001)  # a phase met twice adds up
    slots.capacity = 512  # the step grew the buffers
    gc.collect()  # and a collection ran during it
    events, phases = record.close(decode_rows=3, slots=slots, waited=0.0005)
    assert events == {"put", "rows", "grow", "gc"}  # rows: 0 decoding before, 3 now
    assert phases["forward"] >= 0.003 and phases["read"] == 0.0005


def test_the_next_step_starts_clean_and_compares_with_its_own_start() -> None:
    slots = SimpleNamespace(slots=4, capacity=256)
    record = StepRecord()
    gc.disable()  # no collection may fall between begin and close here
    try:
        record.begin(slots)
        first, _ = record.close(decode_rows=3, slots=slots, waited=0.0)
        record.begin(slots)
        events, phases = record.close(decode_rows=3, slots=slots, waited=0.0)
    finally:
        gc.enable()
    assert events == set() and phases == {"read": 0.0}  # same rows, same buffers, no collection
    assert first is not events  # the first step's set is the one /stats keeps: never reused


def test_a_step_names_the_lane_phases_it_overlapped() -> None:
    lane = LanePhases()
    record = StepRecord(lane)
    gc.disable()
    try:
        lane.enter("lane_build")  # the lane was building as the step began
        record.begin(None)
        lane.enter("lane_launch")
        lane.enter("lane_device")
        lane.enter(None)  # and its job ended before the step did
        events, _ = record.close(decode_rows=0, slots=None, waited=0.0)
        assert events == {"lane_build", "lane_launch", "lane_device"}
        record.begin(None)  # the lane idle throughout
        events, _ = record.close(decode_rows=0, slots=None, waited=0.0)
        assert events == set()
        lane.enter("lane_device")  # a job waiting for the device as the next step begins and ends
        record.begin(None)
        events, _ = record.close(decode_rows=0, slots=None, waited=0.0)
        assert events == {"lane_device"}
    finally:
        gc.enable()
    assert lane.seconds["lane_build"] > 0 and lane.began == {"lane_build": 1, "lane_launch": 1, "lane_device": 2}
