"""PrefillPacer — how many prompt tokens a mixed iteration may carry beside the decoding rows.

Every decoding row waits for the whole iteration, so a large prompt chunk shows up as a long gap in every
running stream. The pacer measures, on this machine and model, what a decode-only iteration costs and what
a mixed iteration adds on top — a fixed part (on a GPU the decode pipeline stops for it: the host's graph
building is no longer hidden) plus a part per prompt token — and gives prompt chunks what keeps a mixed
iteration within `stall` decode iterations (STALL unless configured), never less than the group's minimum
and never more than its budget. When the fixed part alone passes that bound, small chunks would pay it again and
again for little progress, so prompts get as many tokens as the fixed part costs (at most the budget). With no row
decoding there is no gap to protect: prompts get the whole budget.

The bound is in decode iterations, and while a prompt waits every iteration would be mixed: none would measure one.
So when rows decode and no decode cost is known, their count moved 1.5× since it was measured, REFRESH mixed
iterations ran since, or a mixed iteration came in below it, the pacer asks for one decode-only iteration (an
allowance of 0); a sample weighs the more, the more mixed iterations ran since the last. With a decode cost but
nothing measured beside it yet, a chunk is the minimum, whose cost prices the tokens. When the decode cost moves
2× (many rows left or joined) the mixed samples no longer describe the load: they are dropped and learned again.
While paced chunks are all of one size, their cost prices the tokens anew (the fixed part kept), so a fit made on
a noisy stretch does not stand for good. An allowance grows at most 2× from one mixed iteration to the next, and
after a mixed iteration past its bound shrinks to what that iteration's cost, priced per token, allows.
"""

from __future__ import annotations

from collections import deque
from statistics import median

__all__ = ["DECODE_BURST", "PrefillPacer", "REFRESH", "STALL", "minimum_chunk_default"]

# Decode steps the engine thread may run back to back while nothing else waits for the loop (engine/batch.py).
DECODE_BURST = 32
STALL = 1.5  # a mixed iteration may last this many decode-only iterations (H200: 1.5 beat 2.0 and 1.25)
REFRESH = 16  # mixed iterations in a row before a decode-only one measures the decode cost again
_WEIGHT = 0.2  # exponential moving average: recent iterations count most
_SAMPLES = 32  # mixed iterations the fit looks at
_MIN_SAMPLES = 6
_SPREAD = 1.5  # the fit needs prompt-token counts at least this far apart to tell fixed from per-token cost
_REGIME = 2.0  # a decode cost this many times above or below the one the fit was made beside: learn again
_ROWS = 1.5  # decoding rows this many times more or fewer than the decode cost was measured beside: measure again
_ASKS = 3  # decode-only iterations asked for in a row before pacing goes on without one (none came)
_LOW = 0.8  # a mixed iteration below this share of the decode estimate says the estimate is stale


def minimum_chunk_default() -> int:
    """The fewest prompt tokens a mixed iteration carries when prompts wait: 32 on a GPU (prompt tokens are nearly
    free beside a decode step), 4 on a CPU, where each costs ~10 ms beside a ~80 ms decode step of the demo model
    (2 cores): 32 made every mixed iteration ~5 decode steps long, far past the stall bound. Raises nothing."""
    from engine.accelerator import on_gpu

    return 32 if on_gpu() else 4


class PrefillPacer:
    """Running estimates of iteration costs (seconds) and the prompt-token allowance they imply."""

    def __init__(self, max_tokens: int, min_tokens: int, stall: float = STALL) -> None:
        if not 1.0 < stall < float("inf"):  # nan and inf too: int(inf / cost) raised mid-serving
            raise ValueError(f"stall must be a finite number > 1 (a mixed iteration includes a decode iteration), "
                             f"got {stall}")
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.stall = stall
        self.decode_seconds: float | None = None  # one decode-only iteration
        self.token_seconds: float | None = None  # what one prompt token adds to a mixed iteration
        self.fixed_seconds: float | None = None  # what a mixed iteration adds whatever its prompt tokens
        self._mixed: deque[tuple[int, float]] = deque(maxlen=_SAMPLES)  # (prompt tokens, seconds over decode)
        self._probe = False  # offer a spread count next (half, or twice at the floor), to learn the fixed cost
        self._paced: int | None = None  # the last paced allowance (probes aside)
        self._beside: deque[float] = deque(maxlen=_SAMPLES)  # the decode cost each mixed sample was taken beside
        self._decode_rows = 0  # the decoding rows of the last decode-only iteration
        self._since_decode = 0  # mixed iterations since the last decode-only one
        self._asked = 0  # decode-only iterations asked for since the last came

    def record(self, seconds: float, prompt_tokens: int, decode_rows: int) -> None:
        """Learn from one finished iteration. Raises nothing."""
        if seconds <= 0:
            return
        if prompt_tokens == 0 and decode_rows > 0:
            # Mixed iterations since the last sample aged the estimate: after REFRESH of them it is all but replaced
            # (at 0.2 a sample, a decode cost measured every 16 mixed iterations took minutes to follow a change).
            weight = 1.0 if self._moved(decode_rows) else 1 - (1 - _WEIGHT) ** (1 + self._since_decode)
            self.decode_seconds = seconds if self.decode_seconds is None else \
                self.decode_seconds + weight * (seconds - self.decode_seconds)
            self._decode_rows, self._since_decode, self._asked = decode_rows, 0, 0
            if self._beside and not 1 / _REGIME <= self.decode_seconds / median(self._beside) <= _REGIME:
                # The decoding load changed (64 rows left, a lone stream went on): what prompt tokens add
                # beside it changed too. Paced chunks of one size would never spread the samples again, so
                # the old fit would stand for good: probe and fit afresh, from the old per-token guess.
                self._mixed.clear()
                self._beside.clear()
                self.fixed_seconds = None
                self.decode_seconds = seconds  # the average still lags the change: new samples need today's cost
        elif prompt_tokens > 0 and decode_rows > 0 and self.decode_seconds is not None:
            self._since_decode += 1
            if seconds < _LOW * self.decode_seconds:
                # Cheaper than a decode step: the estimate is stale (the load fell), and against it prompt tokens
                # read as free. Measure it again rather than learn from this.
                self._since_decode = max(self._since_decode, REFRESH)
                return
            # Only mixed iterations: a prompt-only iteration's fixed cost (reading the weights once) is not
            # what prompt tokens add beside decoding rows.
            self._mixed.append((prompt_tokens, max(seconds - self.decode_seconds, 0.0)))
            self._beside.append(self.decode_seconds)
            self._fit()

    def _moved(self, decode_rows: int) -> bool:
        return bool(self._decode_rows) and not 1 / _ROWS < decode_rows / self._decode_rows < _ROWS

    def _fit(self) -> None:
        samples = list(self._mixed)
        counts = [n for n, _ in samples]
        if len(samples) < _MIN_SAMPLES or max(counts) < _SPREAD * min(counts):
            if self.fixed_seconds is None:  # never told apart: charge everything per token (the safe side)
                self.token_seconds = median(extra / n for n, extra in samples)
            elif len(samples) >= _MIN_SAMPLES:
                # Chunks of one size cannot re-split fixed from per-token cost, but they say what such a chunk
                # costs now: keep the fixed part, price tokens from them. A fit made on a noisy stretch (131 ms a
                # token on a CPU another process held) otherwise stood for good, every chunk the minimum.
                self.token_seconds = max(median((extra - self.fixed_seconds) / n for n, extra in samples), 0.0)
            return
        # Theil–Sen (median of pairwise slopes): one compile or page-in spike does not move the estimate.
        slopes = [(e2 - e1) / (n2 - n1) for i, (n1, e1) in enumerate(samples) for n2, e2 in samples[i + 1:]
                  if n2 != n1]
        slope = max(median(slopes), 0.0)
        self.token_seconds = slope
        self.fixed_seconds = max(median(extra - slope * n for n, extra in samples), 0.0)

    def prompt_tokens(self, decode_rows: int) -> int:
        """Prompt tokens the next iteration may carry beside `decode_rows` decoding rows; 0: decode only this time,
        to measure what a decode-only iteration costs now. Raises nothing."""
        room = max(self.max_tokens - decode_rows, self.min_tokens)
        if decode_rows == 0:
            return room
        stale = self.decode_seconds is None or self._moved(decode_rows) or self._since_decode >= REFRESH
        if stale and self._asked < _ASKS:
            # The bound is in decode iterations: without today's cost every mixed iteration was a guess (a fresh
            # server's first long prompt doubled its chunks to the whole budget, 8-20 s gaps on a 2-core CPU).
            self._asked += 1
            return 0
        if self.decode_seconds is None or self.token_seconds is None:
            # Nothing measured beside decoding rows yet: the minimum, whose cost then prices the tokens.
            return self._grown(min(room, self.min_tokens), None)
        allowance = (self.stall - 1.0) * self.decode_seconds
        fixed, token = self.fixed_seconds, self.token_seconds
        if fixed is None:
            # Fixed and per-token cost not told apart yet: pace as if all were per token, and every other time offer
            # another count (half; twice at the floor, where the minimum alone nearly fills the bound: a GPU's
            # fixed part), so the counts spread and the fit can separate the two.
            paced = self._grown(self._affords(room, allowance, token), allowance)
            self._probe = not self._probe
            half = max(self.min_tokens, paced // 2)
            return min(room, (half if paced >= _SPREAD * half else 2 * paced) if self._probe else paced)
        if fixed >= allowance:
            # Any mixed iteration passes the bound: make each one count, with prompt work as long as the fixed part
            # (a GPU's 5 ms pipeline stop buys hundreds of tokens). The whole budget at once was a 6.8 s gap on a CPU
            # where small chunks' noise read as a 107 ms fixed part.
            return self._grown(self._affords(room, fixed, token), 2 * fixed)
        return self._grown(self._affords(room, allowance - fixed, token), allowance)

    def _affords(self, room: int, seconds: float, token: float) -> int:
        """Prompt tokens `seconds` pays for at `token` seconds each (free tokens: all of `room`), within `room`
        and at least the minimum. Raises nothing."""
        return max(self.min_tokens, min(room, int(seconds / token) if token > 0 else room))

    def _grown(self, paced: int, target: float | None) -> int:
        # At most twice the last allowance: a fit made while the decode estimate still lags a change of load
        # can read prompt tokens as free, and the whole budget at once is a gap of seconds on a CPU. After a mixed
        # iteration past `target` (its seconds over decode), at most what that one's cost, priced per token, allows.
        if self._paced is not None:
            paced = min(paced, 2 * self._paced)
        if target is not None and self._mixed:
            n, extra = self._mixed[-1]
            if extra > target:
                paced = min(paced, max(self.min_tokens, int(n * target / extra)))
        self._paced = paced
        return paced
