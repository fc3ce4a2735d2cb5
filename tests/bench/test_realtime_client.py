"""The bench's speaker signals: clips apart by the gap asked for, or joined into one utterance."""

from __future__ import annotations

from bench.realtime_client import GAP_S, SR, signals


def test_clips_lie_the_gap_apart_and_a_zero_gap_joins_them() -> None:
    for gap in (GAP_S, 0.0):
        (pcm, marks), = signals(1, 6.0, None, gap)
        assert marks[0][0] == SR // 2 and len(marks) >= 2  # half a second of lead-in, then the clips
        assert all(b[0] - a[1] == int(gap * SR) for a, b in zip(marks, marks[1:])), gap
        assert len(pcm) >= 6.0 * SR
