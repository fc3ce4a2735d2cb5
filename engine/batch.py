"""LLMBatchGroup — the LLM ExecutionGroup's event-loop half: rows, admission, one token budget, publishing.

Row lifecycle (engine/rows.py RowState): `submit` queues a row → `admit` makes it active (`max_active`, and the
memory budget's KV room: engine/admission.py) → prompt chunks (oldest row first) → the chunk that completes the
prompt samples the first token → one decode token per iteration → finished (stop / length / error) or cancelled,
after which the row and its KV leave the group. Every decoding row gets its token first; prompt chunks fill the
rest of the budget the driver passes (a prompt larger than any budget takes several iterations), or, on a GPU,
run on the prefill lane beside the decode steps (engine/lane.py).

Threading: an iteration's model work is one `context.run(step.measured, ...)` on the engine thread (engine/step.py),
which returns plain Python. A decode-only iteration may be a burst of steps (engine/burst.py) whose results the loop
publishes while the next one runs. This half runs on the event loop: it owns the row lists, publishes deltas with
`send_nowait` into unbounded streams (a slow consumer never blocks the loop) and only mutates rows between steps.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import anyio

from engine.admission import KVAdmission
from engine.burst import PREFIX_PUT, DecodeBursts, StepResult
from engine.constraints import ConstraintTokenizer
from engine.context import loop_caller
from engine.contracts import Delta, ExecutionContext, GenerationRequest
from engine.errors import EngineClosed
from engine.health import StepHealth
from engine.iteration_times import IterationTimes, RecentRates
from engine.lane import PrefillLane, lane_default, lane_tail_default
from engine.memory import MemoryBudget, release_free_memory
from engine.model_args import text_args
from engine.pacing import DECODE_BURST, STALL, PrefillPacer
from engine.plan import ExecutionPlan, resolve_execution
from engine.prefix_cache import PrefixCache
from engine.pulse import Pulse
from engine.request_checks import check_request
from engine.rows import LLMRowStream, Row
from engine.step import BatchStep
from engine.tasks import ExecutionTasks
from engine.waiting_rows import WaitingRows

__all__ = ["LLMBatchGroup", "LLMRowStream", "Row"]

_log = logging.getLogger(__name__)

class LLMBatchGroup:
    """Continuous batching over an mlx-lm model; implements engine.driver.ExecutionGroup."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        context: ExecutionContext,
        *,
        context_length: int,
        max_active: int = 16,
        max_iteration_tokens: int = 512,
        minimum_preparation_tokens: int = 32,
        prefill_stall: float = STALL,
        prefix_cache: PrefixCache | None = None,
        plan: ExecutionPlan | None = None,
        max_kv_tokens: int | None = None,
        budget: MemoryBudget | None = None,
        max_queued: int | None = None,
        keep_mixed_in_flight: bool | None = None,
        decode_burst: int = DECODE_BURST,
        prefill_lane: bool | None = None,
    ) -> None:
        if max_active < 1 or max_iteration_tokens < 1 or minimum_preparation_tokens < 1 or decode_burst < 1:
            raise ValueError("max_active, max_iteration_tokens, minimum_preparation_tokens and decode_burst "
                             "must be >= 1")
        self.model = model
        self.tokenizer = tokenizer
        self.context = context
        self.context_length = context_length
        self.max_active = max_active
        self.max_iteration_tokens = max_iteration_tokens  # read-only, as engine/driver.py's ExecutionGroup says
        self.bursts = DecodeBursts(self, decode_burst)
        self.minimum_preparation_tokens = minimum_preparation_tokens
        self.prefix_cache = prefix_cache
        self.budget = budget
        self._idle_released = True  # freed memory was given back since the last row ran
        self.plan = plan or resolve_execution(model)
        self.vocab_size = int(getattr(text_args(model), "vocab_size", 0) or len(tokenizer))
        self.constraints = ConstraintTokenizer(tokenizer, self.vocab_size)  # built at the first grammar (or warm-up)
        self.tasks = ExecutionTasks()
        self._active: list[Row] = []
        self._wake = Pulse()
        self.landed = Pulse()  # fires as each chat step lands, and as chat goes idle or closes (Engine.chat_turn)
        self._closed = False
        self.recent = RecentRates(window=10.0)  # wall-clock tokens/s over the last 10 s
        self.counters: dict[str, float] = {
            "iterations": 0, "mixed_iterations": 0, "prompt_tokens": 0, "generation_tokens": 0,
            "finished_rows": 0, "cancelled_rows": 0, "step_seconds": 0.0, "prompt_seconds": 0.0,
            "decode_seconds": 0.0, "loop_gap_seconds": 0.0, "publish_seconds": 0.0, "failed_steps": 0,
            "bursts": 0, "burst_steps": 0, "lane_chunks": 0,
        }
        self.pacer = PrefillPacer(max_iteration_tokens, minimum_preparation_tokens, prefill_stall)
        self.iteration_times = IterationTimes()
        self.step = BatchStep(model, self.plan, context_length=context_length, prefix_cache=prefix_cache,
                              counters=self.counters, keep_mixed_in_flight=keep_mixed_in_flight)
        slots = self.step.slots
        self.admission = KVAdmission(budget, slots.step if slots is not None else None) if budget else None
        self._queue = WaitingRows(max_active=max_active, max_queued=max_queued, max_kv_tokens=max_kv_tokens,
                                  admission=self.admission)
        # Prompt chunks on a second engine thread beside the decode steps (engine/lane.py); else packed into them.
        use_lane = lane_default() if prefill_lane is None else prefill_lane
        self.lane = PrefillLane(self.step.prefill, max_iteration_tokens, lambda: self._active, self._lane_landed) \
            if use_lane and self.plan.packed else None
        if self.lane is not None:
            self.step.beside_lane(self.lane.turns)
        self._decode_tail = self.lane is not None and lane_tail_default()  # rows leave their last token to decode
        self.health = StepHealth()
        self._last_step_end: float | None = None
        self._left: list[Row] = []  # finished rows whose last delta went out early: they leave as their step lands
        self._refusing = False  # shutting down: no new rows, running ones finish (`refuse_queued`)

    # -- submission -------------------------------------------------------------------------------

    def submit(self, request: GenerationRequest) -> LLMRowStream:
        """Queue a generation; returns its delta stream.

        Raises what engine/request_checks.py raises (InvalidRequest, ContextTooLong, InvalidSampling), ConstraintError
        for a grammar this tokenizer cannot follow, EngineClosed when closed, QueueFull when max_queued requests already
        wait (engine/errors.py)."""
        if self._closed or self._refusing:
            raise EngineClosed("engine is shutting down")
        self._queue.check_room(self._active, request)
        if not (self._active or self._queue.count()):  # a stall counts from the first row after idling
            self.health.waiting_from_idle()
        prompt = check_request(request, vocab_size=self.vocab_size, context_length=self.context_length)
        if self.admission is not None:
            request = self.admission.fit(request, len(prompt))
        grammar = request.sampling.grammar
        constraint = self.constraints.constraint(grammar) if grammar is not None else None
        row, receive = Row.start(request, prompt, vocab_size=self.vocab_size, tokenizer=self.tokenizer,
                                 decode_tail=self._decode_tail, constraint=constraint)
        self._queue.append(row)
        self._wake.fire()
        return LLMRowStream(row, receive, self._wake.fire)

    # -- ExecutionGroup ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def prune(self) -> None:
        """Drop cancelled rows and queued tasks. A cancelled row's KV is released now, or handed to the
        prefix cache by a task the next iteration runs first. Raises nothing."""
        self.tasks.prune()
        self.step.pipeline.forget_if_done()
        for row in self._queue.drop_cancelled():
            self._end(row, cancelled=True)
        for row in [r for r in self._active if r.cancelled and not r.in_lane]:  # a lane row waits for its job
            self._active.remove(row)
            self._end(row, cancelled=True)

    def has_work(self) -> bool:
        return bool(self._active or self._queue.count() or self.tasks.pending)

    async def wait_for_work(self) -> None:
        """Return when a row or a task arrives, or the group closes. Raises nothing but cancellation."""
        if self.has_work() or self._closed:
            return
        self.landed.fire()  # nothing left to take turns with
        self._last_step_end = None  # idle time is not the event loop's gap between two iterations
        if not self._idle_released:  # nothing runs: hand freed buffers back before sleeping
            self._idle_released = True
            await self.context.run(release_free_memory)
            if self.has_work() or self._closed:
                return
        async with anyio.create_task_group() as tg:

            async def watch(wait: Any) -> None:
                await wait()
                tg.cancel_scope.cancel()

            tg.start_soon(watch, self._wake.current().wait)
            # Bind the current event now: a task enqueued before `watch` starts must still wake us.
            tg.start_soon(watch, self.tasks.changed().wait)

    async def settled(self) -> None:
        """Return once no finished row waits for its step to land (its last delta may go out from inside the step,
        engine/step.py). Event loop. Raises nothing but cancellation."""
        while not self._closed and any(r.finished for r in self._active):
            await self.landed.wait()  # fires as each step lands, and as the group closes

    def admit(self) -> None:
        """Move queued rows into the active set while `max_active` and the KV budget allow."""
        self._queue.admit(self._active)

    def room_to_join(self) -> bool:
        return self._queue.room_to_join(self._active)

    def any_ended(self) -> bool:
        return any(r.ended for r in self._active)

    def has_decoding(self) -> bool:
        return any(r.decoding and not r.in_lane for r in self._active)

    def has_preparing(self) -> bool:
        return any(r.preparing or r.in_lane for r in self._active)

    def supports_mixed(self) -> bool:
        return self.plan.packed

    def running_tokens(self) -> int:
        return sum(1 for r in self._active if r.decoding)

    def prefill_tokens(self) -> int:
        """Prompt tokens beside the decoding rows, paced so their token gap stays bounded (engine/pacing.py)."""
        return self.pacer.prompt_tokens(self.running_tokens())

    async def advance_mixed(self, budget: int) -> None:
        """One packed iteration: every decoding row plus prompt chunks filling the rest of `budget`. With the
        prefill lane: the lane takes the next prompt chunks while this iteration decodes."""
        if self.lane is not None:
            self.lane.feed()
            await self._iterate(0, decode=True, prefill=False)
            return
        await self._iterate(budget, decode=True, prefill=True)

    async def advance_preparation(self) -> None:
        """Prompt chunks (oldest row first) within max_iteration_tokens (with the prefill lane: on the lane,
        waited for, since nothing decodes)."""
        if self.lane is not None:
            cache = self.step.prefix_cache
            if cache is not None and cache.has_pending() and not self.lane.rows:
                # The decode thread's last puts (a finished turn) become takeable by the lane: nothing decodes now,
                # so their copies are done and this costs one hop (on CUDA another thread cannot wait for them).
                await self.context.run(cache.settle)
            self.lane.feed()
            await self.lane.wait()
            self._last_step_end = None  # nothing decoded meanwhile: waiting for a prompt is no loop gap
            return
        await self._iterate(max(self.max_iteration_tokens, 1), decode=False, prefill=True)

    async def advance(self) -> None:
        """One decode token for every decoding row."""
        await self._iterate(0, decode=True, prefill=False)

    def refuse_queued(self) -> int:
        """Shutting down: rows still waiting for admission end now with finish_reason "cancelled" (they would only
        wait out the grace period for that answer), running rows go on, later submits raise EngineClosed. Returns
        how many were waiting. Raises nothing."""
        self._refusing = True
        waiting = self._queue.count()
        for row in self._queue.take_all():
            self._publish(row, row.delta(finish_reason="cancelled"))
        self._wake.fire()
        return waiting

    def close(self) -> None:
        """Stop accepting work, end every row with finish_reason "cancelled", reject queued tasks."""
        self._closed = True
        self.landed.fire()
        self.refuse_queued()
        for row in self._active:
            self._publish(row, row.delta(finish_reason="cancelled"))
        self._active.clear()
        # The step's state (slots, the pipeline) is the engine thread's: a step in flight there would read slots
        # reset under it. `Engine.serve` resets it once the driver has stopped; a group never served has none.
        self.tasks.reject_all()
        if self.lane is not None:
            # It stops after the job in flight, if any (its rows were ended above); joined by Engine.serve's end.
            self.lane.close(join_timeout=0)
        self._wake.fire()

    # -- stats ------------------------------------------------------------------------------------

    def kv_bytes(self) -> int:
        """Bytes held by active rows' KV caches. Raises nothing."""
        slots = self.step.slots
        return self.row_cache_bytes() + (slots.used_nbytes if slots is not None else 0)

    def row_cache_bytes(self) -> int:
        """Bytes of the per-row (prefill) KV caches. Raises nothing."""
        return sum(getattr(c, "nbytes", 0) or 0 for row in list(self._active) for c in row.cache or ())

    def slot_bytes(self) -> int:
        """Bytes allocated for the decode slots, free ones included. Raises nothing."""
        return self.step.slots.nbytes if self.step.slots is not None else 0

    def reserved_kv_bytes(self) -> int:
        """The active rows' projected KV bytes: what admission counts as taken. Raises nothing."""
        return self.admission.projected_bytes(list(self._active)) if self.admission is not None else 0

    def active_rows(self) -> int:
        return sum(1 for r in self._active if not r.finished)  # a finished row whose step has not landed is done

    def queued_rows(self) -> int:
        return self._queue.count()

    # -- the iteration ----------------------------------------------------------------------------

    async def _iterate(self, budget: int, *, decode: bool, prefill: bool) -> None:
        # With the prefill lane, prompts are the lane's alone: a row joins these steps once its prompt is done.
        rows = [r for r in self._active if not r.ended and not r.in_lane and (self.lane is None or not r.preparing)]
        if not rows:
            return
        self._idle_released = False
        start = time.perf_counter()
        # Event-loop time since the previous step; none after an idle pause.
        gap = start - self._last_step_end if self._last_step_end is not None else None
        gap = gap if gap is not None and gap < 1.0 else None
        if gap is not None:
            self.counters["loop_gap_seconds"] += gap
        try:
            call = loop_caller()
            if self.step.pipeline.read_first:  # tokens read inside the step are published at once (engine/step.py)
                self.step.early = functools.partial(call, self._publish_early)
            if decode and not prefill and self.bursts.may_run():
                step = functools.partial(self.step.measured, rows, 0, True, False)
                landed = self.lane.jobs_landed if self.lane is not None else 0  # as the loop saw it when planning
                done = await self.context.run(self.bursts.run, rows, step, functools.partial(call, self._landed), landed)
            else:
                done = await self.context.run(self.step.measured, rows, budget, decode, prefill)
        except Exception as exc:  # one bad step fails the rows it touched, never the loop
            self.step.pipeline.reset()
            self._fail_rows(rows, exc)
            return
        finally:
            self._last_step_end = time.perf_counter()
        self.health.succeeded()
        # As the event loop saw it, hand-off included (less a burst's earlier steps, recorded as they ran).
        done.seconds = self._last_step_end - start - done.earlier
        self._landed(done, gap)

    def _landed(self, done: StepResult, gap: float | None = None) -> None:
        """Event loop: record one step's cost and publish its deltas (rows that finished leave)."""
        if done.cost is not None:
            self.iteration_times.record(done.cost, done.seconds, gap)
            self.pacer.record(done.cost.seconds, done.cost.prompt_tokens, done.cost.decode_rows)
        self.recent.add(done.prompted, done.generated)
        t0 = time.perf_counter()
        for row, delta in done.outputs:
            self._publish(row, delta)
        # Rows that finished, and those whose last delta went out from inside the step (`_publish_early`), leave:
        # one pass over the active rows (a `remove` per finished row was a scan each).
        leaving = {id(r) for r, _ in done.outputs if r.finished} | {id(r) for r in self._left}
        self._left = []
        if leaving:
            self._active = [r for r in self._active if id(r) not in leaving]
        done.published = True
        self.counters["publish_seconds"] += time.perf_counter() - t0
        self.landed.fire()

    def _publish_early(self, outputs: list[tuple[Row, Delta]]) -> None:
        """Event loop: deltas a step read before its iteration ended; rows they finish leave as it lands. Raises
        nothing."""
        t0 = time.perf_counter()
        for row, delta in outputs:
            self._publish(row, delta)
            if row.finished:
                self._left.append(row)
        self.counters["publish_seconds"] += time.perf_counter() - t0

    # -- the prefill lane ---------------------------------------------------------------------------

    def _lane_landed(self, rows: list[Row], result: Any, error: BaseException | None) -> None:
        """Event loop: a lane job ended (engine/lane.py hands its rows back first): first tokens published, or
        its rows failed. Raises nothing."""
        if error is not None:
            self._fail_rows(rows, error if isinstance(error, Exception) else RuntimeError(repr(error)))
        else:
            self.health.succeeded()
            outputs, prompted = result
            self._landed(StepResult(outputs, None, 0.0, prompted, len(outputs)))
        self._wake.fire()

    def _fail_rows(self, rows: list[Row], exc: Exception) -> None:
        """The rows a failed step or lane job touched end with an error delta; others go on. Raises nothing."""
        _log.exception("engine step failed for %d row(s)", len(rows), exc_info=exc)
        self.counters["failed_steps"] += 1
        error = self.health.failed(exc)
        for row in rows:
            self.step.kv.release(row)
            self._publish(row, row.delta(finish_reason="error", error=error))
        self._active = [r for r in self._active if r not in rows]

    # -- event-loop side --------------------------------------------------------------------------

    def _publish(self, row: Row, delta: Delta) -> None:
        if row.deliver(delta):
            self.counters["finished_rows"] += 1

    def _end(self, row: Row, *, cancelled: bool) -> None:
        row.end()
        if cancelled:
            self.counters["cancelled_rows"] += 1
        if self.step.kv.keeps(row):
            # Its KV still helps the next turn: stored by a task on the engine thread before the next step.
            self.tasks.enqueue(lambda: self.step.kv.put(row), label=PREFIX_PUT)
        else:
            self.step.kv.release(row)
