"""PrefillPacer — how many prompt tokens a mixed iteration may carry beside the decoding rows.

Every decoding row waits for the whole iteration, so a large prompt chunk shows up as a long gap in every
running stream. The pacer measures, on this machine and model, what a decode-only iteration costs and
what each prompt token adds on top, and gives prompt chunks what keeps a mixed iteration within
`STALL` decode iterations (never less than the group's minimum, never more than its budget). With no row
decoding there is no gap to protect: prompts get the whole budget. Before anything is measured the
budget is used as configured.
"""

from __future__ import annotations

__all__ = ["PrefillPacer", "STALL"]

STALL = 2.0  # a mixed iteration may last this many decode-only iterations
_WEIGHT = 0.2  # exponential moving average: recent iterations count most


class PrefillPacer:
    """Running estimates of iteration costs (seconds) and the prompt-token allowance they imply."""

    def __init__(self, max_tokens: int, min_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.decode_seconds: float | None = None  # one decode-only iteration
        self.token_seconds: float | None = None  # what one prompt token adds to an iteration

    def record(self, seconds: float, prompt_tokens: int, decode_rows: int) -> None:
        """Learn from one finished iteration. Raises nothing."""
        if seconds <= 0:
            return
        if prompt_tokens == 0 and decode_rows > 0:
            self.decode_seconds = _ema(self.decode_seconds, seconds)
        elif prompt_tokens > 0 and decode_rows > 0 and self.decode_seconds is not None:
            # Only mixed iterations: what the prompt tokens add on top of a decode iteration. A prompt-only
            # iteration's fixed cost (reading the weights once) would pass for per-token cost.
            self.token_seconds = _ema(self.token_seconds, max(seconds - self.decode_seconds, 0.0) / prompt_tokens)

    def prompt_tokens(self, decode_rows: int) -> int:
        """Prompt tokens the next iteration may carry beside `decode_rows` decoding rows. Raises nothing."""
        room = max(self.max_tokens - decode_rows, self.min_tokens)
        if decode_rows == 0 or self.decode_seconds is None or not self.token_seconds:
            return room
        paced = int((STALL - 1.0) * self.decode_seconds / self.token_seconds)
        return max(self.min_tokens, min(room, paced))


def _ema(current: float | None, sample: float) -> float:
    return sample if current is None else current + _WEIGHT * (sample - current)
