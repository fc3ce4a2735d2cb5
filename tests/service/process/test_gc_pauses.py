"""service/process/gc_pauses.py: collections are counted with their pauses by generation, and startup's objects
are frozen out of later collections."""

from __future__ import annotations

import gc
from typing import Iterator

import pytest

from service.process.gc_pauses import GC_PAUSES, GcPauses, freeze_startup, ready_for_serving


@pytest.fixture
def pauses() -> Iterator[GcPauses]:
    p = GcPauses()
    p.install()
    yield p
    gc.callbacks.remove(p._callback)


def test_counts_each_collection_with_its_pause(pauses: GcPauses) -> None:
    gc.collect(0)
    gc.collect(2)
    gc.collect(2)
    snap = pauses.snapshot()
    gens = snap["generations"]
    assert gens[0]["collections"] >= 1 and gens[2]["collections"] >= 2
    assert 0 < gens[2]["pause_ms_max"] <= gens[2]["pause_ms_total"]
    assert snap["recent_full_pause_ms_max"] == gens[2]["pause_ms_max"]


def test_installing_twice_counts_once(pauses: GcPauses) -> None:
    pauses.install()
    gc.collect(2)
    assert pauses.snapshot()["generations"][2]["collections"] == 1


def test_freeze_moves_what_is_alive_out_of_collections() -> None:
    keep = [[i] for i in range(1000)]
    try:
        frozen = freeze_startup()
        # Another thread may free frozen objects meanwhile (the count fell by 2 once in CI): `keep` stays alive.
        assert frozen >= len(keep) and len(keep) <= gc.get_freeze_count() <= frozen
        assert not any(gc.is_tracked(x) and x in gc.get_objects(generation=2) for x in keep[:3])
    finally:
        gc.unfreeze()


def test_ready_sets_the_serving_thresholds_and_counts_pauses() -> None:
    before = gc.get_threshold()
    try:
        assert ready_for_serving(False, (20000, 20, 30)) == 0
        assert gc.get_threshold() == (20000, 20, 30)
        assert GC_PAUSES._callback in gc.callbacks
        ready_for_serving(False, None)  # none given: left as they are
        assert gc.get_threshold() == (20000, 20, 30)
    finally:
        gc.set_threshold(*before)


def test_a_snapshot_reports_the_count_taken_at_the_freeze_without_walking_it(monkeypatch) -> None:
    # gc.get_freeze_count() walks every frozen object under the GIL (20-40 ms for a served model's ~500,000):
    # /stats and /metrics must not pause every stream for it.
    keep = [[i] for i in range(1000)]
    before = GC_PAUSES.frozen
    try:
        frozen = ready_for_serving(True, None)
        assert frozen >= len(keep) and GC_PAUSES.frozen == frozen

        def walked() -> int:
            raise AssertionError("the frozen generation was walked")

        monkeypatch.setattr(gc, "get_freeze_count", walked)
        assert GC_PAUSES.snapshot()["frozen_objects"] == frozen
    finally:
        monkeypatch.undo()
        gc.unfreeze()
        GC_PAUSES.frozen = before
