"""What the Whisper scheduler counts: steps by kind, windows, fallbacks, and a bounded record of recent steps
(kind, limit, rows, work, seconds) summarised for /stats."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.percentiles import ms_summary

__all__ = ["StepCounters", "StepRecord", "step_summary"]


@dataclass
class StepCounters:
    """Totals since start and a bounded history of recent steps (newest last)."""

    encoder_steps: int = 0
    decoder_steps: int = 0
    paced_steps: int = 0
    windows: int = 0
    fallbacks: int = 0
    whole_window_redos: int = 0  # windows over a cut encoder context redone over the whole window
    max_rows: int = 0
    handoffs: int = 0  # times the windows in flight moved to another step thread (chat came or went)
    encode_s: float = 0.0  # seconds spent in encoder steps since start (what bounds how many speakers keep up)
    decode_s: float = 0.0  # seconds spent in decoder steps since start
    kinds: list[str] = field(default_factory=list)  # recent step kinds, newest last (bounded)
    steps: list["StepRecord"] = field(default_factory=list)  # recent steps, newest last (bounded)


@dataclass(frozen=True)
class StepRecord:
    """One step: its kind, time limit (None: the full budget), the rows decoding when it began, the work it
    did (encoder: window-positions of chunked units plus windows of the others; decoder: tokens fed, 0 with
    the full budget) and its seconds."""

    kind: str
    limit: float | None
    rows: int
    work: int
    seconds: float


def step_summary(steps: list[StepRecord]) -> dict[str, Any]:
    """Recent steps' seconds by kind, paced (limit set) or not: n, p50/p99/max ms, how many passed their
    limit, and the rows decoding as they began (p50, max). Raises nothing."""
    out: dict[str, Any] = {}
    for key in sorted({(s.kind, s.limit is not None) for s in steps if s.kind != "idle"}):
        picked = [s for s in steps if (s.kind, s.limit is not None) == key]
        rows = sorted(s.rows for s in picked)
        out[f"{key[0]}{'_paced' if key[1] else ''}"] = {
            **ms_summary(s.seconds for s in picked),
            "over_limit": sum(1 for s in picked if s.limit is not None and s.seconds > s.limit),
            # how many windows decoded together: many speakers' rows should share a step, not queue for one
            "rows_p50": rows[len(rows) // 2], "rows_max": rows[-1]}
    return out
