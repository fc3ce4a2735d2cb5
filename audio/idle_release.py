"""IdleRelease — when live speech and file transcription give MLX's freed buffers back: once their windows have
stopped for a while.

Whisper's windows come in many shapes (contexts, prompts, a decode's keys growing a token at a time), so MLX's buffer
cache fills towards its limit while they run (4 live sessions for 10 minutes on a CPU: 266 → 676 MB, RSS 1.34 →
1.84 GB) and kept all of it after the last window: the chat engine gives the cache back only when chat goes idle.
Not between two utterances (the next window, a second later, would allocate it all again) nor while chat has rows
(its buffers are warm and in use).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["IdleRelease"]


@dataclass
class IdleRelease:
    """Decides, at each tick of the speech service, whether to release now. Event loop only."""

    after_s: float = 5.0  # seconds without a window in flight or finishing before a release
    _busy_at: float = -math.inf  # the last tick that saw a window in flight or one more finished
    _seen_done: int = 0  # windows finished as of that tick
    _released: bool = True  # nothing ran since the last release (or since start)
    releases: int = 0

    def due(self, now: float, in_flight: int, done: int, chat_active: bool) -> bool:
        """Whether to release at `now` (monotonic seconds), given the windows in flight, the windows finished so
        far and whether chat has rows; counts a release it answers True for. Raises nothing."""
        if in_flight or done != self._seen_done:
            self._busy_at, self._seen_done, self._released = now, done, False
            return False
        if self._released or chat_active or now - self._busy_at < self.after_s:
            return False
        self._released = True
        self.releases += 1
        return True
