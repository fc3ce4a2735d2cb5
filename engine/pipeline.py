"""DecodePipeline — keep one step in flight while the host reads the previous step's tokens.

Step N+1 is built from step N's still-lazy sampled tokens and launched (`mx.async_eval`) before the host
reads step N's tokens; detokenization and stop matching then overlap the device's work. The launched step is
carried between iterations (all on the one engine thread). A decode step over unchanged rows, in slot order,
feeds the next decode step whole (`step`). Any other iteration with decoding rows `take`s it unread and feeds
its tokens lazily into its own forward, which may then stay in flight itself (engine/step.py: mixed steps on
a GPU); an iteration that cannot go on from it first `drain`s it — reads its tokens for rows still running
and drops those of rows that finished or were cancelled. A speculative step writes one KV position past what
its row has fed; exports cut the slot to the row's fed tokens, and reading a running row's token makes them
equal again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, cast

import mlx.core as mx

from engine.gil import QuickReturn
from engine.rows import Row, slot_order
from engine.runner import Segment
from engine.sampling import newest_logprobs, sample_rows

__all__ = ["DecodePipeline", "InFlight"]


@dataclass
class InFlight:
    """A launched, unread step: `tokens[i]` is the next token of `rows[i]`. A decode step's rows are in slot
    order (`mixed` False: the next decode step may feed `tokens` whole); a mixed step also carried prompt
    chunks, and its rows that completed a prompt come last."""

    rows: list[Row]
    tokens: mx.array | None  # None only for a launched step that sampled nothing (engine/step.py lands it)
    mixed: bool = False
    prompt_tokens: int = 0  # prompt tokens the step carried
    decode_rows: int = 0  # rows that decoded in it (the rest sampled a first token)
    touched: list[mx.array] = field(default_factory=list)  # caches written without logits, to wait for


class DecodePipeline:
    """One step of lookahead for slot iterations (see module doc)."""

    def __init__(self, forward: Callable[[list[Segment]], Any], enabled: bool,
                 quick_return: QuickReturn | None = None, read_first: bool = False) -> None:
        self.forward = forward  # the group's runner.forward (looked up per call)
        self.enabled = enabled  # the runner has a SlotKV (packed path with per-token RoPE)
        # The decode thread's launches take the GIL back quickly where asked (engine/gil.py).
        self.quick_return = quick_return or QuickReturn(None)
        # Read a step's tokens before starting the next: on a CPU `mx.async_eval` returns only once the step it
        # starts is nearly done (MLX waits while over 10 tasks are queued), so tokens read after it came a step late.
        self.read_first = read_first
        self.inflight: InFlight | None = None
        self.waited = 0.0  # seconds blocked in `read` (the engine step resets it; /stats iteration_times)
        # Seconds of this step's `launch`es by part, wall and this thread's CPU (reset with `waited`): a launch whose
        # wall time is not CPU time waited (for the GIL or a lock), which a slow step beside the lane tells apart.
        self.parts: dict[str, float] = {}

    def reset(self) -> None:
        """Forget the in-flight step (its rows failed or the group closed). Raises nothing."""
        self.inflight = None

    def forget_if_done(self) -> None:
        """Drop the in-flight step once none of its rows runs (so it holds no old KV buffers). Raises nothing."""
        if self.inflight is not None and all(r.ended for r in self.inflight.rows):
            self.inflight = None

    def feeds(self, ordered: Sequence[Row]) -> bool:
        """Whether the in-flight step's tokens are, in order, the next inputs of `ordered` (slot order).
        Raises nothing."""
        flight = self.inflight
        return (flight is not None and not flight.mixed and len(flight.rows) == len(ordered)
                and all(a is b for a, b in zip(flight.rows, ordered)))

    def eligible(self, rows: Sequence[Row]) -> bool:
        """Every row decodes from a slot and samples without history-dependent processing. Raises nothing."""
        return self.enabled and bool(rows) and all(
            r.decoding and r.slot is not None and r.sampler.pipelines for r in rows)

    def take(self) -> InFlight | None:
        """Hand the in-flight step over unread (the next iteration goes on from it). Raises nothing."""
        flight, self.inflight = self.inflight, None
        return flight

    def drain(self) -> list[tuple[Row, int]]:
        """Read the in-flight step; returns (row, token) for rows still running (others' tokens are dropped).
        Raises whatever evaluating the step raises."""
        flight, self.inflight = self.inflight, None
        if flight is None:
            return []
        return [(r, t) for r, t in zip(flight.rows, self.read_step(flight)) if not r.ended]

    def step(self, rows: Sequence[Row], take: Callable[[list[Row], list[int]], None]) -> list[Row]:
        """Launch the next step and read the current one; `take(rows, tokens)` gets the current step's tokens (rows in
        slot order) as soon as they are read: before the next step starts where `read_first`, else after. Returns
        the rows. The rows must be `eligible`. Raises whatever the forward or its evaluation raises."""
        ordered = slot_order(rows)
        current = self.inflight.tokens if self.inflight is not None and self.feeds(ordered) else None
        self.inflight = None
        if current is None:
            current = self.launch(ordered, None)
        wanted = self.build(ordered, current)
        if self.read_first:
            take(ordered, self.read(current))
            self.start(wanted)
        else:
            self.start(wanted)
            take(ordered, self.read(current))
        self.inflight = InFlight(ordered, wanted[0], decode_rows=len(ordered))
        return ordered

    def launch(self, rows: Sequence[Row], fed: mx.array | None) -> mx.array:
        """Build one decode step (fed: lazy tokens, else each row's last_token) and start it. Raises
        whatever building the forward raises."""
        wanted = self.build(rows, fed)
        self.start(wanted)
        return wanted[0]

    def build(self, rows: Sequence[Row], fed: mx.array | None) -> list[mx.array]:
        """Build one decode step, unstarted: [its tokens, the log probabilities sampled with them]. Raises whatever
        building the forward raises."""
        # With `fed` only each segment's length counts; eligible rows always have a last token.
        t0, c0 = time.perf_counter(), time.thread_time()
        ids = [[0] if fed is not None or r.last_token is None else [r.last_token] for r in rows]
        segments = [Segment(t, None, True, r.slot, fed) for t, r in zip(ids, rows)]
        logits = self.forward(segments)
        tokens = sample_rows(logits, [r.sampler for r in rows])
        self._add("build", time.perf_counter() - t0, time.thread_time() - c0)
        return [tokens, *newest_logprobs(rows)]

    def start(self, wanted: list[mx.array]) -> None:
        """Start a built step on the device. Raises nothing of its own."""
        t0, c0 = time.perf_counter(), time.thread_time()
        with self.quick_return.around():
            # The global key too, for the prefill lane's next draw (engine/step.py); log probabilities with their tokens.
            mx.async_eval(*wanted, mx.random.state)
        self._add("launch", time.perf_counter() - t0, time.thread_time() - c0)

    def _add(self, part: str, wall: float, cpu: float) -> None:
        self.parts[part] = self.parts.get(part, 0.0) + wall
        self.parts[part + "_cpu"] = self.parts.get(part + "_cpu", 0.0) + cpu

    def read_step(self, flight: InFlight) -> list[int]:
        """Wait for a step taken from the pipeline and return its tokens; its rows' next tokens are known from
        here on. Raises whatever the evaluation raises."""
        ids = self.read(flight.tokens)
        for r in flight.rows:
            r.token_in_flight = False
        return ids

    def read(self, tokens: mx.array | None) -> list[int]:
        """Wait for `tokens` and return them as ints ([] for none). Raises whatever the evaluation raises."""
        if tokens is None:
            return []
        t0 = time.perf_counter()
        ids = cast(list[int], tokens.tolist())
        self.waited += time.perf_counter() - t0
        return [int(t) for t in ids]
