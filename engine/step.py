"""BatchStep — the engine-thread half of the LLM batch group: one iteration of model work.

`run(rows, budget, decode, prefill)` is called once per iteration through the ExecutionContext (on the
engine thread) and returns plain Python: (row, delta) pairs for the event loop to publish. Inside it:
the step in flight is gone on from (its tokens fed lazily) or, when that cannot be, read first; the slot
buffers are sized, new rows get their KV (a prefix-cache hit or a fresh cache), rows whose prompt is done
move into decode slots, then one forward over the planned segments, sampling, detokenization and stop
matching. Rows that finish hand their KV to the prefix cache here, before their slot is freed (where KV lives:
engine/row_kv.py). Nothing here touches the row lists the event loop owns (engine/batch.py).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Callable, cast

import mlx.core as mx

from engine.accelerator import cpu_default, on_gpu
from engine.burst import StepResult
from engine.constraints import ConstraintFailed
from engine.contracts import Delta
from engine.prompt_scores import fresh_scores
from engine.gil import QuickReturn, gil_return_seconds
from engine.iteration_times import StepCost
from engine.kv_snapshot import arrays_of
from engine.pipeline import DecodePipeline, InFlight
from engine.plan import ExecutionPlan
from engine.prefix_cache import PrefixCache
from engine.rows import Row, plan_iteration, slot_order
from engine.row_kv import RowKV
from engine.runner import PackedRunner, Runner, Segment, SeparateRunner
from engine.sampling import newest_logprobs, sample_rows
from engine.slots import SlotKV
from engine.step_record import LanePhases, StepRecord

if TYPE_CHECKING:
    from engine.lane import DecodeFirst

__all__ = ["BatchStep"]

_log = logging.getLogger(__name__)


class BatchStep:
    """One iteration's model work over the group's rows (see module doc). `counters` is the group's."""

    def __init__(self, model: Any, plan: ExecutionPlan, *, context_length: int, prefix_cache: PrefixCache | None,
                 counters: dict[str, float], keep_mixed_in_flight: bool | None = None) -> None:
        self.context_length = context_length
        self.prefix_cache = prefix_cache
        self.counters = counters
        self.runner: Runner = PackedRunner(model) if plan.packed else SeparateRunner(model)
        self.slots: SlotKV | None = getattr(self.runner, "slots", None)  # decode rows' KV, one buffer per layer
        self.pipeline = DecodePipeline(lambda segments: self.runner.forward(segments), self.slots is not None,
                                       QuickReturn(gil_return_seconds()), cpu_default("TANDEM_READ_FIRST"))
        # Where the pipeline reads a step's tokens before starting the next (a CPU), their deltas go to the event loop
        # from inside the iteration (`early`, set by the group), not a step later when it returns.
        self.early: Callable[[list[tuple[Row, Delta]]], None] | None = None
        self._posted = 0  # tokens of this iteration already handed to `early`
        self.kv = RowKV(model, self.slots, prefix_cache, lambda: self.record)  # the rows' caches, slots and puts
        # Keep steps launched by the general path (mixed ones, decode after rows changed) in flight: on a GPU the
        # host builds the next forward while the device runs them. On a CPU both share the cores and the pacer
        # then misreads a mixed step's cost (measured: whole-budget chunks, token gaps of seconds); default: GPU.
        self.keep_mixed = on_gpu() if keep_mixed_in_flight is None else keep_mixed_in_flight
        # The last iteration's cost, counted for the step whose tokens it delivered: for the group's prefill
        # pacing and /stats iteration_times.
        self.last_cost: StepCost | None = None
        # What the current step did and where its time went, for /stats: one record per engine thread (the
        # prefill lane's steps run beside the decode thread's; engine/batch.py).
        self._records = threading.local()
        # Where the prefill lane's job is, named in the decode steps' events (`beside_lane`).
        self.lane_phases: LanePhases | None = None
        self._counting = threading.Lock()  # both engine threads add to the group's token counters

    def beside_lane(self, turns: DecodeFirst) -> None:
        """A prefill lane runs `prefill` beside this step's decode steps: the runner's builds go decode first
        (engine/lane.py) and the decode steps' records name the lane's phases. Call before the first step. Raises
        nothing."""
        self.lane_phases = LanePhases()
        if isinstance(self.runner, PackedRunner):
            self.runner.turns = turns

    @property
    def record(self) -> StepRecord:
        """This thread's step record. Raises nothing."""
        record = getattr(self._records, "record", None)
        if record is None:
            record = self._records.record = StepRecord(self.lane_phases)
        return record

    def prefill(self, rows: list[Row], budget: int) -> tuple[list[tuple[Row, Delta]], int]:
        """Prefill lane (a second engine thread, beside the decode thread's steps): prompt chunks of `rows`, oldest
        first within `budget`, evaluated before this returns, so nothing lazy leaves this thread's stream. Rows whose
        prompt completes sample and accept their first token. Touches no slot and no in-flight step: the rows are
        the lane's alone until the event loop takes them back. Returns (deltas, prompt tokens). Raises what the
        forward or its evaluation raises."""
        self.record.begin(None)
        phases = self.lane_phases = self.lane_phases or LanePhases()  # set with the lane (a bare call: its own)
        phases.enter("lane_build")
        try:
            for row in rows:
                if row.cache is None and row.slot is None:
                    self.kv.attach(row)
            plan = plan_iteration(rows, budget, False, True)
            logits = self.runner.forward([Segment(tokens, r.cache, want, score=r.chunk_scorer(tokens))
                                          for r, tokens, want in plan]) if plan else None
            sampled = [r for r, _, want in plan if want]
            tokens = sample_rows(logits, [r.sampler for r in sampled]) if sampled and logits is not None else None
            # Every row's cache, with a chunk or not: a prefix hit's cut was built here, and a row whose hit left only
            # its last token has no chunk (the decode thread cannot evaluate this thread's arrays).
            touched = [a for r in rows for c in r.cache or () for a in arrays_of(c)]
            keys = [a for r in sampled for a in r.sampler.arrays()]
            scored = fresh_scores(r.scores for r, _, _ in plan)
            wanted = ([tokens] if tokens is not None else []) + touched + keys + scored
            phases.enter("lane_launch")
            mx.async_eval(wanted, mx.random.state)  # the global key too: the decode thread's next draw splits it
            phases.enter("lane_device")
            mx.eval(wanted, mx.random.state)
        finally:
            phases.enter(None)
        n_prompt = self._fed_prompts(plan)
        for row in rows:  # those whose chunk reached the tail, and those a prefix hit left only the last token
            row.hand_tail()
        ids = cast(list[int], tokens.tolist()) if tokens is not None else []
        outputs = [(r, self.accept(r, t)) for r, t in zip(sampled, ids)]
        if self.prefix_cache is not None:
            self.prefix_cache.settle()  # the boundary puts' copies, just behind the chunk: the decode thread may take them
        self._count((("prompt_tokens", n_prompt), ("generation_tokens", len(ids)), ("lane_chunks", int(bool(plan)))))
        return [(r, d) for r, d in outputs if d is not None], n_prompt

    def _count(self, adds: tuple[tuple[str, float], ...]) -> None:
        with self._counting:
            for key, add in adds:
                if add:
                    self.counters[key] = self.counters.get(key, 0) + add

    def measured(self, rows: list[Row], budget: int, decode: bool, prefill: bool) -> StepResult:
        """Engine thread: `run`, with what the event loop records and publishes for it (its deltas, cost and the
        tokens it counted). Raises what `run` raises."""
        t0 = time.perf_counter()
        self.record.counts = (0, 0)
        outputs = self.run(rows, budget, decode, prefill)
        cost, self.last_cost = self.last_cost, None
        prompted, generated = self.record.counts
        return StepResult(outputs, cost, time.perf_counter() - t0, prompted, generated)

    def run(self, rows: list[Row], budget: int, decode: bool, prefill: bool) -> list[tuple[Row, Delta]]:
        """Engine thread: one forward over the planned segments, sampling, detokenization. Raises what
        the forward or its evaluation raises (the group fails the rows it touched)."""
        t0 = time.perf_counter()
        self.pipeline.waited = 0.0
        self.pipeline.parts.clear()
        self._posted = 0
        self.record.begin(self.slots)
        outputs: list[tuple[Row, Delta | None]] = []
        flight = self.pipeline.inflight
        # Decode-only over the rows of an in-flight decode step: it feeds the next step whole (pipeline.step).
        ordered = slot_order(rows)
        whole = flight is not None and decode and not prefill and self.pipeline.feeds(ordered)
        # Otherwise an iteration with decoding rows goes on from the in-flight step (its tokens fed lazily):
        # building this forward overlaps the device's work on that step, also when rows joined or left, and when
        # the slot buffers shrink (the compaction's copies queue behind the in-flight step's writes).
        chain = (flight is not None and not whole and decode
                 and all(r.sampler.pipelines for r in flight.rows if not r.ended))
        if flight is not None and not whole and not chain:
            self.record.note("drain")
            outputs = [(r, self.accept(r, t)) for r, t in self.pipeline.drain()]
            rows = [r for r in rows if not r.ended]
        self.kv.size_slots(rows)
        for row in rows:
            if row.cache is None and row.slot is None:
                self.kv.attach(row)
            elif self.slots is not None and row.decoding and row.slot is None:
                self.record.note("adopt")
                row.slot, row.cache = self.slots.adopt(row.cache or []), None
        self.record.tick("prepare", t0)
        if chain:
            return self._chained(t0, rows, budget, prefill)
        if decode and self.pipeline.eligible(rows):
            t_step = time.perf_counter()
            ordered = self.pipeline.step(rows, lambda read, ids: self._take(outputs, read, ids))
            self.record.tick("pipeline", t_step)
            self.last_cost = self._cost(time.perf_counter() - t0, 0, len(ordered))
            return self._finish(t0, outputs, 0, len(ordered))
        if not (plan := plan_iteration(rows, budget, decode, prefill)):
            return self._finish(t0, outputs, 0, 0)
        t_forward = time.perf_counter()
        launch = self._launch(plan, {})
        if self._keep(launch):
            return self._finish(t0, outputs, 0, 0)  # read by the next iteration, which goes on from it
        landed = self._land(launch)
        self.last_cost = self._cost(time.perf_counter() - t_forward, launch.prompt_tokens, launch.decode_rows)
        return self._finish(t0, outputs + landed, launch.prompt_tokens, launch.decode_rows)

    def _take(self, outputs: list[tuple[Row, Delta | None]], rows: list[Row], ids: list[int]) -> None:
        """The pipeline read a step's tokens: accept them into `outputs`, and hand every delta so far to the event loop
        at once where the next step has not started yet (`early`; a row that finished leaves the group when the
        iteration lands). Raises nothing."""
        if self.early is None or not self.pipeline.read_first:
            outputs += [(r, self.accept(r, t)) for r, t in zip(rows, ids)]
            return
        # A finishing row's prefix-cache copy reads KV the built next step writes: started at its put, it ran that
        # step (a CPU's async_eval waits) before the row's last delta went out, a token gap late. It starts after.
        with self.prefix_cache.copies_held() if self.prefix_cache is not None else nullcontext():
            outputs += [(r, self.accept(r, t)) for r, t in zip(rows, ids)]
            deltas = [(r, d) for r, d in outputs if d is not None]
            if deltas:
                self.early(deltas)
        self._posted += len(outputs)
        outputs.clear()

    def _chained(self, t0: float, rows: list[Row], budget: int, prefill: bool) -> list[tuple[Row, Delta]]:
        """An iteration launched on top of the in-flight step: its rows' next tokens enter the forward unread;
        that step is read (and its tokens accepted) while the device runs this one, which then stays in flight
        for the next iteration (or is read here when a row joined in it, or its rows' samplers need their history).
        Rows that finish on the in-flight token drop the token computed after it. Raises what the forward raises."""
        flight = self.pipeline.take()
        assert flight is not None and flight.tokens is not None  # a kept step always sampled
        plan = plan_iteration(rows, budget, True, prefill)
        lazy = self._lazy_tokens(flight, plan)
        launch = self._launch(plan, lazy) if plan else None
        t_wait = time.perf_counter()
        ids = self.pipeline.read_step(flight)
        waited = time.perf_counter() - t_wait  # the in-flight step's own time
        outputs: list[tuple[Row, Delta | None]] = [(r, self.accept(r, t)) for r, t in zip(flight.rows, ids)
                                                   if not r.ended]
        # A row that joins here (back from the lane, or its prompt done in this step) has had one token so far: its
        # next is read now, not an iteration later (kept in flight, its second token came ~3.4 steps after its first).
        # (A `decode_tail` row's first token is sampled here: it stays in flight like its batch mates' tokens.)
        joined = launch is not None and any(id(r) not in lazy and r.generated for r in launch.rows)
        if launch is None or (not joined and self._keep(launch)):
            # This iteration's time is the gap the streams of the step just read saw.
            self.last_cost = self._cost(time.perf_counter() - t0, flight.prompt_tokens, flight.decode_rows)
            return self._finish(t0, outputs, flight.prompt_tokens, flight.decode_rows)
        self.pipeline.waited -= waited
        landed = self._land(launch)
        self.last_cost = self._cost(time.perf_counter() - t0 - waited, launch.prompt_tokens, launch.decode_rows)
        # The step read here delivered its own prompt chunks (a mixed step): they count with this one's.
        mixed = sum(int(s.prompt_tokens > 0 and s.decode_rows > 0) for s in (flight, launch))
        return self._finish(t0, outputs + landed, flight.prompt_tokens + launch.prompt_tokens, launch.decode_rows,
                            mixed)

    @staticmethod
    def _lazy_tokens(flight: InFlight, plan: list[tuple[Row, list[int], bool]]) -> dict[int, Any]:
        """The in-flight step's unread tokens by id(row). When every decoding row of the plan comes from that
        step, they share one array in the plan's (slot) order: one gather instead of a slice per row."""
        assert flight.tokens is not None
        where = {id(r): i for i, r in enumerate(flight.rows) if not r.ended}
        decoders = [r for r, _, _ in plan if r.decoding]
        if decoders and all(id(r) in where for r in decoders):
            picks = [where[id(r)] for r in decoders]
            block = flight.tokens if picks == list(range(len(flight.rows))) else flight.tokens[mx.array(picks)]
            return {id(r): block for r in decoders}
        return {key: flight.tokens[i:i + 1] for key, i in where.items()}

    def _launch(self, plan: list[tuple[Row, list[int], bool]], lazy: dict[int, Any]) -> InFlight:
        """Build the planned forward and start it; prompt chunks count as fed from here on. `lazy`: unread
        tokens by id(row), fed in place of those rows' last token. Raises what the forward raises."""
        if any(r.last_token is None and r.decoding and id(r) not in lazy for r, _, _ in plan):
            raise RuntimeError("a row's next token is in flight but no step feeds it")
        t = time.perf_counter()
        segments = [Segment([0] if id(r) in lazy else tokens, r.cache, want, r.slot, lazy.get(id(r)),
                            None if r.decoding else r.chunk_scorer(tokens)) for r, tokens, want in plan]
        logits = self.runner.forward(segments)
        t = self.record.tick("forward", t)
        sampled = [r for r, _, want in plan if want]
        tokens = sample_rows(logits, [r.sampler for r in sampled]) if sampled and logits is not None else None
        t = self.record.tick("sample", t)
        # Sampled rows' KV updates are ancestors of their tokens; only chunks without logits need naming (every
        # array of their caches: a hybrid model's recurrent layers keep state, not keys and values).
        touched = [a for s in segments if not s.logits for c in s.cache or () for a in arrays_of(c)]
        # The global random key too: left lazy, the prefill lane's next draw would build on this thread's stream.
        # Rows that asked for log probabilities: computed in the same launch as their tokens.
        extra = newest_logprobs(sampled) + fresh_scores(r.scores for r, _, _ in plan)
        with self.pipeline.quick_return.around():  # the GIL back quickly, where asked (engine/gil.py)
            mx.async_eval(([tokens] if tokens is not None else []) + touched + extra, mx.random.state)
        self.record.tick("launch", t)
        n_decode = sum(1 for r, _, _ in plan if r.decoding)
        n_prompt = self._fed_prompts(plan)
        # Only decode rows, in slot order (plan_iteration's): the next decode step may take the tokens whole.
        mixed = n_prompt > 0 or any(r.slot is None for r in sampled)
        return InFlight(sampled, tokens, mixed=mixed, prompt_tokens=n_prompt, decode_rows=n_decode, touched=touched)

    def _fed_prompts(self, plan: list[tuple[Row, list[int], bool]]) -> int:
        """The planned prompt chunks count as fed (segment boundaries they passed go to the prefix cache); returns
        their tokens. Raises nothing."""
        n_prompt = 0
        for r, chunk, _ in plan:
            if not r.decoding:
                r.prefilled, n_prompt = r.prefilled + len(chunk), n_prompt + len(chunk)
                self.kv.boundary_puts(r, r.prefilled - len(chunk))
        return n_prompt

    def _cost(self, seconds: float, prompt_tokens: int, decode_rows: int) -> StepCost:
        events, phases = self.record.close(decode_rows, self.slots, self.pipeline.waited)
        phases.update((f"pipeline_{part}", seconds) for part, seconds in self.pipeline.parts.items())
        return StepCost(seconds, prompt_tokens, decode_rows, min(self.pipeline.waited, seconds), events, phases)

    def _keep(self, launch: InFlight) -> bool:
        """Leave a launched step unread, for the next iteration to go on from (the pipeline's slot path): only
        with decoding rows whose samplers need no history, so the next step samples before this one is read.
        Raises nothing."""
        if not (self.keep_mixed and self.pipeline.enabled and launch.decode_rows and launch.tokens is not None
                and all(r.sampler.pipelines for r in launch.rows)):
            return False
        launch.touched = []
        self.pipeline.inflight = launch
        for r in launch.rows:
            r.token_in_flight = True
        return True

    def _land(self, launch: InFlight) -> list[tuple[Row, Delta | None]]:
        """Wait for a launched forward and accept its sampled tokens (rows that ended meanwhile drop theirs).
        Raises what the evaluation raises."""
        t0 = time.perf_counter()
        mx.eval(([launch.tokens] if launch.tokens is not None else []) + launch.touched)
        self.pipeline.waited += time.perf_counter() - t0
        ids = cast(list[int], launch.tokens.tolist()) if launch.tokens is not None else []
        return [(r, self.accept(r, t)) for r, t in zip(launch.rows, ids) if not r.ended]

    def reset(self) -> None:
        """Forget the in-flight step and every slot (the group closed). Raises nothing."""
        self.pipeline.reset()
        if self.slots is not None:
            self.slots.reset()

    # -- tokens -----------------------------------------------------------------------------------

    def accept(self, row: Row, token: int) -> Delta | None:
        """Take one sampled token: the delta to publish (None while text is held back). A row's own fault
        (detokenizer, stop matcher) ends only that row, with an error delta. Raises nothing."""
        t = time.perf_counter()
        try:
            return self._take_token(row, token)
        except Exception as exc:  # this row's own fault: only it ends
            if isinstance(exc, ConstraintFailed):  # the grammar its request asked for: the client's to hear
                _log.info("row ended: %s", exc)
                error, param = str(exc), exc.param
            else:
                _log.exception("row failed on token %d", token)
                error, param = f"{type(exc).__name__}: {exc}", None
            row.finish()
            self.kv.release(row)
            return row.delta(finish_reason="error", error=error, error_param=param)
        finally:
            self.record.tick("accept", t)

    def _take_token(self, row: Row, token: int) -> Delta | None:
        if row.tail_fed():
            self._count((("prompt_tokens", 1),))
        if row.scores is not None:  # its first token: the prompt's were computed by the chunks before it
            row.unsent_prompt_logprobs, row.scores = row.scores.take(), None
        row.sampler.accept(token)
        row.generated.append(token)
        row.last_token = token
        row.unsent_ids.append(token)
        logprob = row.sampler.take_logprob(token)  # None unless the row asked
        at_limit = len(row.prompt) + len(row.generated) >= self.context_length
        step = row.stopper.add(token, at_context_limit=at_limit)
        if logprob is not None and token not in row.stopper.stop_ids:  # a stop token is no part of the text
            # Where its text ends; a stop string's cut falls inside the token that completed it, which never goes.
            end = row.stopper.position() if step.finish_reason is None else math.inf
            row.unsent_logprobs.append((end, logprob))
        if step.finish_reason is not None:
            row.finish()
            self.kv.put(row)  # its KV goes to the prefix cache (cut to the fed tokens) and the slot is freed
        elif not step.text:
            return None  # held back (partial character or possible stop string): nothing to show yet
        return row.outgoing(step.text, step.finish_reason, row.stopper.stopped_by, row.stopper.shown_before())

    def _finish(self, t0: float, outputs: list[Any], n_prompt: int, n_decode: int,
                mixed: int | None = None) -> list[tuple[Row, Delta]]:
        """Count the iteration and return its deltas. `mixed`: how many mixed steps it delivered (default: one when
        it has both prompt and decode tokens). Raises nothing."""
        if self.prefix_cache is not None:
            if self.prefix_cache.reclaim():
                self.record.note("evict")
            # This thread's puts, for the lane to take: with a step in flight, those of the iteration before (their
            # copies queued behind the step this one read), else all (nothing runs ahead of them).
            self.prefix_cache.settle(keep_latest=self.pipeline.inflight is not None)
        dt, n_gen = time.perf_counter() - t0, len(outputs) + self._posted
        self.record.counts = (n_prompt, n_gen)
        total = max(n_prompt + n_gen, 1)  # the step's time is split by token share (prompt vs generation rates)
        mixed = int(n_prompt > 0 and n_decode > 0) if mixed is None else mixed
        self._count((("iterations", 1), ("mixed_iterations", mixed),
                     ("prompt_tokens", n_prompt), ("generation_tokens", n_gen), ("step_seconds", dt),
                     ("prompt_seconds", dt * n_prompt / total), ("decode_seconds", dt * n_gen / total)))
        return [(r, d) for r, d in outputs if d is not None]
