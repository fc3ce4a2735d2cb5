"""GuessCadence — how much new speech a live session waits for before it guesses (re-decodes its open audio) again.

An utterance's first guess comes sooner than the rest (`first_redecode_s`), sooner again after a first guess came
back empty (`retry_redecode_s`). After a decode slower than `guess_slow_s` (its wait for the scheduler included) the
session is behind: guesses run only every `slow_redecode_s` of new speech until a decode comes back sooner, so its
decodes go to finals (8 speakers on 2 cores fell 8–11 s behind, each guessing over all its open audio again and
again), while a long utterance still shows text now and then. A session whose chunk was refused for its backlog
guesses at once all the same (audio/live.py `pressed`): under a backlog limit shorter than `slow_redecode_s` the
speech that guess waited for was the speech refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from audio.live_config import LiveConfig

__all__ = ["GuessCadence"]


@dataclass
class GuessCadence:
    """A session's guess pacing; `decode_s` and `empty` are set as its decodes come back. Event loop only."""

    config: LiveConfig
    decode_s: float = 0.0  # the latest decode's seconds, its wait for the scheduler included
    empty: bool = False  # the open utterance's last guess had no text

    def every(self, has_text: bool) -> float | None:
        """Seconds of new speech before the next guess (None: no guess), given whether the open utterance `has_text`
        (committed or tentative). Raises nothing."""
        c = self.config
        if c.guess_slow_s is not None and self.decode_s > c.guess_slow_s:
            return c.slow_redecode_s
        if c.first_redecode_s is None or has_text:
            return c.redecode_s
        if self.empty and c.retry_redecode_s is not None:
            return min(c.first_redecode_s, c.redecode_s, c.retry_redecode_s)
        return min(c.first_redecode_s, c.redecode_s)
