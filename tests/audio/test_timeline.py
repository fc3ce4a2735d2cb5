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


def test_a_span_reaching_just_past_a_cut_stays_in_the_speech_before_it() -> None:
    # speech at 0-3 s and 23-26 s (20 s of silence cut out): compact 0-3 | 3-6
    t = Timeline()
    t.add(0, 3 * SR)
    t.add(23 * SR, 3 * SR)
    grace = 0.5 * SR
    # a segment ending 0.17 s into the second piece was mapped to 23.17 s
    assert t.span(0, 3.17 * SR, grace) == (0, 3 * SR)
    # one starting 0.2 s before the cut, its words in the second piece, starts where that speech does
    assert t.span(2.8 * SR, 5 * SR, grace) == (23 * SR, 25 * SR)
    # a segment well into both pieces spans the cut, as it says
    assert t.span(2 * SR, 4 * SR, grace) == (2 * SR, 24 * SR)
    # all of it within the grace on both sides: the side it reaches further into
    assert t.span(2.9 * SR, 3.2 * SR, grace) == (23 * SR, 23.2 * SR)
    assert t.span(1 * SR, 2 * SR, grace) == (1 * SR, 2 * SR)  # within one piece: as it is


def test_the_next_break_is_the_first_piece_after_a_long_enough_gap() -> None:
    _, timeline = compact(np.zeros(100, np.float32), [(0, 10), (12, 20), (40, 50), (53, 60)])
    assert timeline.next_break(0, 5) == 18  # the piece from 40 (compact 18) follows a gap of 20
    assert timeline.next_break(0, 2) == 10 and timeline.next_break(10, 2) == 18  # strictly after the position
    assert timeline.next_break(18, 5) is None and timeline.next_break(0, 30) is None
