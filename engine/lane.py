"""PrefillLane — prompt chunks on a second engine thread (its own MLX stream) beside the decode thread's steps.

Launching a prompt chunk costs the host 5–8 ms on the H200, and packed into a decode step every decoding row
waited for it (bench/prefill_thread.py, 32 rows beside 512-token chunks: decode step p99 10.6 ms packed, 5.8 ms
beside the lane). The event loop hands the idle lane the next chunks (`feed`) and marks their rows `in_lane`:
no other thread touches them until the job lands, which the loop learns through the `landed` callback it gave.
Default: on a GPU; a CPU's cores are shared by both threads anyway (TANDEM_PREFILL_LANE=on|off overrides).
Both threads build their graphs in Python under one GIL; `DecodeFirst` lets a decode step's build go first.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import anyio

from engine.accelerator import gpu_default
from engine.context import EngineThread, loop_caller
from engine.rows import Row, prefill_shares

__all__ = ["DecodeFirst", "PrefillLane", "lane_default", "lane_tail_default"]

Landed = Callable[[list[Row], Any, "BaseException | None"], None]


def lane_default() -> bool:
    """Whether a group gets a lane when not told: TANDEM_PREFILL_LANE=on|off, else on a GPU. Raises nothing."""
    return gpu_default("TANDEM_PREFILL_LANE")


def lane_tail_default() -> bool:
    """Whether a lane leaves each prompt's last token to the row's first decode step (engine/rows.py `decode_tail`):
    TANDEM_LANE_TAIL=on|off, default on. Sampled on the lane, a first token waited for the row to join the decode
    steps before its second came (~2.4 steps: poisson8's ITL p99 was mostly those gaps). Raises nothing."""
    return os.environ.get("TANDEM_LANE_TAIL", "on").lower() != "off"


class DecodeFirst:
    """The GIL, decode first. A thread that wants the GIL takes it from the holder after the switch interval, so
    beside a prompt chunk a decode step's graph build took turns with the chunk's and ran about twice as long (H200
    poisson8: 9.3 ms pipelined steps against 4.4 at p50). While the decode thread builds a forward (`decoding`), the
    lane waits at its next layer (`yield_to_decode`: a lock wait frees the GIL) and builds while decode's kernels
    run. Its wait is capped (`patience`) so a busy decode thread never starves the lane."""

    def __init__(self, lane: EngineThread, patience: float = 0.01) -> None:
        self.lane = lane
        self.patience = patience
        self._free = threading.Event()  # set while no decode build runs
        self._free.set()
        self.waits = 0  # the lane's waits for a decode build (its thread only)
        self.waited_seconds = 0.0
        self.waiting = threading.Event()  # set as the lane begins a wait (tests order events by it)

    @contextmanager
    def decoding(self) -> Iterator[None]:
        """Around a forward's build on the decode thread (a no-op on the lane). Raises what the body raises."""
        if self.lane.is_current():
            yield
            return
        self._free.clear()
        try:
            yield
        finally:
            self._free.set()

    def yield_to_decode(self) -> None:
        """On the lane, between layers: wait while the decode thread builds (a no-op elsewhere). Raises nothing."""
        if self._free.is_set() or not self.lane.is_current():
            return
        t0 = time.perf_counter()
        self.waiting.set()
        self._free.wait(self.patience)
        self.waits += 1
        self.waited_seconds += time.perf_counter() - t0


class PrefillLane:
    """The lane's thread and its job in flight (one at a time). Event loop only, but for `jobs_done`, which the
    lane thread counts up as a job ends so that a decode burst on the other thread hands back at once.
    `job(rows, budget)` runs on the lane; `landed(rows, result, error)` then runs on the loop, once the rows are
    the group's again, and the lane takes the next chunks of `active()`'s preparing rows."""

    def __init__(self, job: Callable[[list[Row], int], Any], budget: int, active: Callable[[], Sequence[Row]],
                 landed: Landed) -> None:
        self.thread = EngineThread("tandem-prefill")
        self.turns = DecodeFirst(self.thread)  # the runner's forward builds decode first (engine/runner.py)
        self.rows: list[Row] = []  # the rows of the job in flight
        # Jobs ended, counted on the lane thread, and jobs landed, counted on the loop; never reset. A burst ends once
        # `jobs_done` passes the loop's `jobs_landed` of when it was planned: a job that ended but had not landed then
        # was counted already when the burst began, which kept its rows out of the whole burst (CI: 19 steps).
        self.jobs_done = 0
        self.jobs_landed = 0
        self._job, self._budget, self._active, self._handler = job, budget, active, landed
        self._closed = False
        self._landed = anyio.Event()
        self._to_loop: Callable[..., None] | None = None

    def feed(self) -> None:
        """When idle, run the job on the lane for the preparing rows that get a share of the budget (the job plans
        the same shares: engine/rows.py prefill_shares, which ages the rows it passes over here, the job seeing only
        those it took). Call on the loop. Raises nothing."""
        self._to_loop = self._to_loop or loop_caller()
        if self.rows or self._closed:
            return
        rows = [r for r, _ in prefill_shares(self._active(), self._budget)]
        if not rows:
            return
        for r in rows:
            r.in_lane = True
        self.rows, call, job, budget = rows, self._to_loop, self._job, self._budget

        def done(result: Any, error: BaseException | None) -> None:  # on the lane thread
            self.jobs_done += 1
            try:
                call(self._land, rows, result, error)
            except RuntimeError:  # the event loop is gone (shutdown)
                pass

        self.thread.submit(lambda: job(rows, budget), done)

    def _land(self, rows: list[Row], result: Any, error: BaseException | None) -> None:
        """Event loop: the job's rows are the group's again; the group handles the result (unless it closed, which
        ended them), then the next chunks go out and a driver waiting for the lane goes on. Raises nothing."""
        self.rows = []
        self.jobs_landed += 1
        for r in rows:
            r.in_lane = False
        if not self._closed:
            self._handler(rows, result, error)
            self.feed()
        self.wake()

    def wake(self) -> None:
        """Event loop, once a landed job was handled: frees `wait`. Raises nothing."""
        self._landed.set()
        self._landed = anyio.Event()

    async def wait(self) -> None:
        """Until the job in flight, if any, has landed and been handled. Raises nothing but cancellation."""
        if self.rows:
            await self._landed.wait()

    def close(self, join_timeout: float | None = 5.0) -> None:
        """Stop the thread after the job in flight (its rows are not handed back to a closed group). Raises
        nothing."""
        self._closed = True
        self.thread.close(join_timeout)
