"""audio/idle_release.py: speech gives MLX's freed buffers back once its windows have stopped for a while — not
between two windows, not while chat has rows, once per burst of windows."""

from __future__ import annotations

from audio.idle_release import IdleRelease


def test_a_release_comes_once_after_the_windows_stop_for_long_enough() -> None:
    r = IdleRelease(after_s=5.0)
    assert not r.due(0.0, in_flight=0, done=0, chat_active=False)  # nothing ran since the start
    assert not r.due(1.0, in_flight=2, done=0, chat_active=False)
    assert not r.due(2.0, in_flight=0, done=2, chat_active=False)  # the two just finished: busy until now
    assert not r.due(6.9, in_flight=0, done=2, chat_active=False)
    assert r.due(7.0, in_flight=0, done=2, chat_active=False) and r.releases == 1
    assert not r.due(20.0, in_flight=0, done=2, chat_active=False) and r.releases == 1  # once per burst


def test_a_window_finished_between_two_ticks_counts_as_busy() -> None:
    r = IdleRelease(after_s=5.0)
    assert not r.due(0.0, in_flight=0, done=0, chat_active=False)
    # never seen in flight: one tick sees only that one more window is done
    assert not r.due(10.0, in_flight=0, done=1, chat_active=False)
    assert not r.due(14.0, in_flight=0, done=1, chat_active=False)
    assert r.due(15.0, in_flight=0, done=1, chat_active=False)


def test_no_release_while_chat_has_rows() -> None:
    r = IdleRelease(after_s=0.0)
    r.due(0.0, in_flight=1, done=0, chat_active=False)
    assert not r.due(1.0, in_flight=0, done=1, chat_active=True)
    assert not r.due(9.0, in_flight=0, done=1, chat_active=True)
    assert r.due(10.0, in_flight=0, done=1, chat_active=False)
