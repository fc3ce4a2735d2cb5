"""When a supervisor respawns a child that died, and when it gives up.

A child that exits with EXIT_STARTUP_FAILED could not start at all (a model that does not load, a bad
option): respawning it would fail the same way, so the supervisor stops. Any other death (kill -9, out
of memory, a crash) is respawned after a delay that grows while deaths come quickly, until more than
`max_restarts` happen within `window` seconds (a crash loop).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["RestartPolicy", "Restart", "EXIT_STARTUP_FAILED", "EXIT_SERVING_FAILED", "EXIT_STOPPED_LOADING"]

# Exit code of a child that could not start (the model did not load, a hook failed at startup).
EXIT_STARTUP_FAILED = 3
# Exit code of a child whose service failed after it was ready: respawned like any other death.
EXIT_SERVING_FAILED = 4
# Exit code of a child stopped (SIGINT/SIGTERM) before its models were loaded: the supervisor exits as a process that
# signal ended (130 for a Ctrl-C), as it does when the signal comes before any child started.
EXIT_STOPPED_LOADING = 5


@dataclass(frozen=True)
class Restart:
    """A decision: respawn after `delay` seconds, or give up (`reason` says why either way)."""

    respawn: bool
    delay: float
    reason: str


@dataclass
class RestartPolicy:
    """Respawn unexpected deaths with backoff; stop on startup failures and crash loops."""

    max_restarts: int = 5
    window: float = 60.0
    first_delay: float = 0.0
    max_delay: float = 10.0
    _recent: deque[float] = field(default_factory=deque)

    def decide(self, exitcode: int | None, now: float) -> Restart:
        """What to do about a child that exited with `exitcode` (negative: killed by that signal) at
        `now` (monotonic seconds). Raises nothing."""
        if exitcode == EXIT_STARTUP_FAILED:
            return Restart(False, 0.0, "it could not start (see the error above)")
        while self._recent and now - self._recent[0] > self.window:
            self._recent.popleft()
        if len(self._recent) >= self.max_restarts:
            return Restart(False, 0.0, f"it died {len(self._recent) + 1} times within {self.window:.0f} s")
        self._recent.append(now)
        # 0 s for a first death, then 0.5, 1, 2 ... s while deaths keep coming within the window.
        quick = len(self._recent) - 1
        delay = self.first_delay if quick == 0 else min(self.max_delay, 0.5 * 2 ** (quick - 1))
        how = f"killed by signal {-exitcode}" if exitcode is not None and exitcode < 0 else f"exit code {exitcode}"
        return Restart(True, delay, f"it died unexpectedly ({how})")
