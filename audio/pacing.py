"""How much one Whisper step may do: the step budget, what work costs on this machine (learnt from the steps
as they run), and the sizing of the next unit or forward to a time limit.

Each kind of work (an encoder unit kind, a decoder forward with or without logits) gets a line
`seconds ≈ a + b·x` fitted by exponentially weighted least squares over its recent runs, where x is the
work's size: window-positions for chunked encoder units, windows for the others, tokens fed for forwards.
"""

from __future__ import annotations

from dataclasses import dataclass
import time
from typing import Any, Callable, Iterable, Sequence, TypeVar

from engine.accelerator import gpu_default, on_gpu

__all__ = ["StepBudget", "StepClock", "GPU_MIN_STEP_SECONDS", "Pace", "LinearCost", "StepCosts", "GRANULE", "size_unit",
           "size_forward"]

Pace = Callable[[], "float | None"]  # seconds of a chat iteration while chat rows decode, else None
T = TypeVar("T")


@dataclass(frozen=True)
class StepBudget:
    """How much one step may do. `encoder_positions`: positions a chunked encoder unit covers (a 30 s window
    is 1500 per conv and per layer) with the full budget. `decode_tokens`: tokens each row advances per
    decoder step with the full budget. `max_rows`: rows per decoder step (more wait their turn).
    `chat_share`: while chat decodes, a step lasts at most this share of a chat iteration.
    `min_step_seconds`: with the full budget, a step goes on with more of the same work until it has taken
    this long — on a GPU one unit is far shorter than a round trip through the loop; None: 5 ms on a GPU,
    0 on a CPU (see `resolved_min_step`). `catch_up_seconds`: while chat decodes, a step's share doubles
    for each such span the oldest live session's window has waited (up to 8×), so live speech that falls
    behind catches up. `even_steps`: with the full budget, an encoder step that follows a decoder step goes on
    as long as that one took, so the two kinds share the time evenly (H200, 16 live speakers of a turbo shape:
    decoder steps of ~17 ms alternated with encoder steps of ~5.5 ms, and windows waited for their encoding while
    the few rows decoding paid a forward's fixed cost each); None: on a GPU (TANDEM_WHISPER_EVEN=on|off
    overrides), not on a CPU."""

    encoder_positions: int = 375
    decode_tokens: int = 4
    max_rows: int = 32
    chat_share: float = 0.3
    min_step_seconds: float | None = None
    catch_up_seconds: float = 1.0
    even_steps: bool | None = None

    def __post_init__(self) -> None:
        if self.encoder_positions < 1 or self.decode_tokens < 1 or self.max_rows < 1:
            raise ValueError("step budget values must be >= 1")
        if not 0 < self.chat_share <= 10:
            raise ValueError("chat_share must be in (0, 10]")
        if self.min_step_seconds is not None and not 0 <= self.min_step_seconds <= 1:
            raise ValueError("min_step_seconds must be in [0, 1]")
        if not self.catch_up_seconds > 0:
            raise ValueError("catch_up_seconds must be > 0")

    def share(self, waited: float) -> float:
        """The share of a chat iteration a step may take when the oldest live session's window in flight has
        waited `waited` seconds: `chat_share`, doubled per `catch_up_seconds` waited. On the H200, four live
        sessions of a large-v3-turbo shape beside one chat stream finished no window in 6 s at a fixed
        0.3 (steps that small are mostly launch overhead). Raises nothing."""
        return self.chat_share * 2.0 ** min(max(waited, 0.0) / self.catch_up_seconds, _MAX_DOUBLINGS)

    def resolved_min_step(self) -> float:
        """`min_step_seconds`, its default chosen by the device MLX runs on. Engine thread (imports MLX).
        Raises nothing."""
        if self.min_step_seconds is not None:
            return self.min_step_seconds
        return GPU_MIN_STEP_SECONDS if on_gpu() else 0.0

    def resolved_even(self) -> bool:
        """`even_steps`, its default chosen by the device MLX runs on. Engine thread (imports MLX). Raises
        nothing."""
        return gpu_default("TANDEM_WHISPER_EVEN") if self.even_steps is None else self.even_steps


class StepClock:
    """When a Whisper step ends: its time limit (a share of a chat iteration while chat has rows, else None: the
    full budget, counted in units and tokens), how long a full-budget step goes on (the minimum step), and how long a
    full-budget encoder step goes on after a decoder step (`even_steps`)."""

    def __init__(self, budget: StepBudget, pace: Pace | None = None) -> None:
        self.budget = budget
        self.pace = pace
        self.limit: float | None = None  # the running step's time limit, set as it starts
        self.paced = False
        self.last_decode_s = 0.0  # the last full-budget decoder step's seconds (StepBudget.even_steps)
        self._min_step_seconds: float | None = None  # resolved on the engine thread at the first step
        self._even: bool | None = None  # resolved on the engine thread at the first encoder step

    def plan(self, live_since: Iterable[float]) -> None:
        """Set the step's limit from chat's pace and the start times of the live sessions' windows in flight. Read as
        the step starts on the engine thread, not when it was queued: a step queued while chat was idle must not run
        unpaced once chat has begun. Raises nothing."""
        pace = self.chat_pace()
        self.paced = pace is not None
        if pace is None:
            self.limit = None
            return
        waited = max((time.perf_counter() - since for since in live_since), default=0.0)
        self.limit = self.budget.share(waited) * pace

    def chat_pace(self) -> float | None:
        """A chat iteration's seconds while chat has rows, else None. Raises nothing."""
        pace = self.pace() if self.pace is not None else None
        return pace if pace is not None and pace > 0 else None

    def encode_for(self, last_kind: str) -> float:
        """How long a full-budget encoder step goes on: the minimum step, or with `even_steps` after a decoder
        step, as long as that one took. Engine thread. Raises nothing."""
        if self._even is None:
            self._even = self.budget.resolved_even()
        if self._even and last_kind == "decode":
            return max(self.min_step(), self.last_decode_s)
        return self.min_step()

    def min_step(self) -> float:
        """How long a full-budget step goes on with more of the same work. Engine thread. Raises nothing."""
        if self._min_step_seconds is None:
            self._min_step_seconds = self.budget.resolved_min_step()
        return self._min_step_seconds

    def stats(self) -> dict[str, Any]:
        """The resolved minimum step and the running step's limit, in ms (None while unknown). Raises nothing."""
        return {"min_step_ms": None if self._min_step_seconds is None else round(self._min_step_seconds * 1e3, 3),
                "step_limit_ms": None if self.limit is None else round(self.limit * 1e3, 3)}


_MAX_DOUBLINGS = 3.0  # a step's share grows to 8× at most: 2.4 chat iterations at the default 0.3
GPU_MIN_STEP_SECONDS = 0.005  # a few decode iterations of a 1B chat model on an H200

# Paced encoder chunks cover a multiple of this many positions: on CPU these sizes give the same bits as the
# unpaced ones (measured with tiny.en), so pacing never changes a transcript.
GRANULE = 64
_DECAY = 0.9  # weight of the previous runs against the newest


class LinearCost:
    """seconds ≈ a + b·x over recent runs (a, b ≥ 0); proportional (a = 0) while every run had the same x."""

    def __init__(self) -> None:
        self.w = self.sx = self.sy = self.sxx = self.sxy = 0.0
        self.runs = 0

    def record(self, x: float, seconds: float) -> None:
        """Learn from one run. Raises nothing."""
        if x <= 0 or seconds < 0:
            return
        d = _DECAY
        self.w, self.sx, self.sy = d * self.w + 1, d * self.sx + x, d * self.sy + seconds
        self.sxx, self.sxy = d * self.sxx + x * x, d * self.sxy + x * seconds
        self.runs += 1

    def line(self) -> tuple[float, float] | None:
        """(a, b), or None before any run. Raises nothing."""
        if self.w <= 0 or self.sx <= 0:
            return None
        mx, my = self.sx / self.w, self.sy / self.w
        var = self.sxx / self.w - mx * mx
        if var > 1e-9 * mx * mx:
            b = (self.sxy / self.w - mx * my) / var
            a = my - b * mx
            if a >= 0 and b >= 0:
                return a, b
        return 0.0, self.sy / self.sx

    def predict(self, x: float) -> float | None:
        """Seconds for size x, or None before any run. Raises nothing."""
        line = self.line()
        return None if line is None else line[0] + line[1] * x

    def fits(self, seconds: float) -> float | None:
        """The largest size that fits in `seconds` (may be ≤ 0), or None before any run. Raises nothing."""
        line = self.line()
        if line is None:
            return None
        a, b = line
        return float("inf") if b <= 0 else (seconds - a) / b


class StepCosts:
    """One LinearCost per kind of work."""

    def __init__(self) -> None:
        self.kinds: dict[str, LinearCost] = {}

    def __getitem__(self, kind: str) -> LinearCost:
        cost = self.kinds.get(kind)
        if cost is None:
            cost = self.kinds[kind] = LinearCost()
        return cost

    def stats(self) -> dict[str, Any]:
        """Per kind: runs, and the fitted intercept (ms) and slope (µs per unit of size). Raises nothing."""
        out: dict[str, Any] = {}
        for kind, cost in sorted(self.kinds.items()):
            line = cost.line()
            if line is not None:
                out[kind] = {"runs": cost.runs, "ms": round(line[0] * 1e3, 3), "us_per_unit": round(line[1] * 1e6, 3)}
        return out


def size_unit(cost: LinearCost, group: Sequence[T], chunked: bool, stage_left: int, left: float | None,
              ran: bool) -> tuple[Sequence[T], int] | None:
    """(windows, positions) for the next paced encoder unit within `left` seconds (None: no limit), or None
    to end the step. `stage_left`: positions the chunked stage still has; a chunked unit covers a multiple
    of GRANULE positions. Nothing measured or nothing fits: one window's smallest unit if nothing ran yet.
    Raises nothing."""
    smallest = min(stage_left, GRANULE) if chunked else 0
    room = None if left is None else cost.fits(left)
    if room is None:
        return None if ran else (group[:1], smallest)
    if not chunked:  # a fixed size: as many windows as fit
        fit = len(group) if room == float("inf") else min(len(group), int(room))
        return (group[:fit], 0) if fit >= 1 else None if ran else (group[:1], 0)
    for g in (len(group), 1):
        n = stage_left if room == float("inf") else min(stage_left, int(room / g) // GRANULE * GRANULE)
        if n >= smallest:
            return group[:g], n
    return None if ran else (group[:1], smallest)


def size_forward(cost: LinearCost, ordered: Sequence[T], unfed: Callable[[T], int], left: float,
                 ran: bool) -> tuple[list[T], int] | None:
    """Rows for the next paced decoder forward (taken in the given order) and the prompt tokens each may
    feed, within `left` seconds, or None to end the step. Rows ready to sample come first (one token each);
    rows still feeding their prompt share what is left, at least 8 tokens each. Raises nothing."""
    room = cost.fits(left)
    if room is None:  # nothing measured: one row, a small prompt chunk
        return None if ran else (list(ordered[:1]), 8)
    sampling = [w for w in ordered if unfed(w) <= 1]
    feeding = [w for w in ordered if unfed(w) > 1]
    take = sampling[: max(0, int(room))] if room != float("inf") else list(sampling)
    extra = room - len(take)
    share = 8
    if feeding and extra >= 8:
        share = int(min(extra / len(feeding), 1 << 16)) if extra != float("inf") else 1 << 16
        share = max(8, share)
        take += feeding[: max(1, int(extra // share))] if extra != float("inf") else feeding
    if not take:
        return None if ran else (list(ordered[:1]), 8)
    return take, share
