"""How much new speech a live session waits for before its next guess."""

from __future__ import annotations

from audio.guess_cadence import GuessCadence
from audio.live_config import LiveConfig


def test_first_guesses_come_sooner_and_a_session_behind_guesses_rarely() -> None:
    c = GuessCadence(LiveConfig(redecode_s=1.0, first_redecode_s=0.75, retry_redecode_s=0.5, guess_slow_s=2.0,
                                slow_redecode_s=5.0))
    assert c.every(has_text=True) == 1.0 and c.every(has_text=False) == 0.75
    c.empty = True
    assert c.every(has_text=False) == 0.5  # after an empty first guess
    c.decode_s = 2.5
    assert c.every(has_text=False) == 5.0 and c.every(has_text=True) == 5.0  # behind
    assert GuessCadence(LiveConfig(slow_redecode_s=None), decode_s=2.5).every(True) is None
    c.decode_s = 0.4
    assert c.every(has_text=True) == 1.0  # a decode came back sooner: not behind any more
