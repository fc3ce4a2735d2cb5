"""audio/timeline.py: speech pieces concatenated, and compact times mapped back to the source."""

from __future__ import annotations

import numpy as np
import pytest

from audio.timeline import Timeline, compact

SR = 16000


def test_compact_concatenates_pieces_and_maps_times_back() -> None:
    pcm = np.arange(10 * SR, dtype=np.float32)
    out, timeline = compact(pcm, [(1 * SR, 3 * SR), (6 * SR, 7 * SR)])
    assert len(out) == 3 * SR and out[0] == SR and out[2 * SR] == 6 * SR
    assert timeline.length == 3 * SR
    assert timeline.seconds(0.0) == 1.0 and timeline.seconds(1.5) == 2.5
    assert timeline.seconds(2.0) == 6.0  # a start on the boundary belongs to the later piece
    assert timeline.seconds(2.0, end=True) == 3.0  # an end on it, to the earlier one
    assert timeline.seconds(2.5, end=True) == 6.5
    assert timeline.seconds(9.0, end=True) == 7.0  # past the last piece: its end


def test_contiguous_pieces_merge_and_going_back_is_refused() -> None:
    t = Timeline()
    t.add(0, 100)
    t.add(100, 50)
    t.add(400, 10)
    assert t.length == 160 and t.to_source(120) == 120 and t.to_source(150) == 400
    with pytest.raises(ValueError):
        t.add(300, 5)


def test_no_pieces_is_empty() -> None:
    out, timeline = compact(np.ones(100, np.float32), [])
    assert len(out) == 0 and timeline.length == 0 and timeline.seconds(1.0) == 1.0
