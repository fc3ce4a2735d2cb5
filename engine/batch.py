"""LLMBatchGroup — the LLM ExecutionGroup: rows, admission, one token budget, mixed iterations.

Row lifecycle: `submit` queues a row → `admit` moves it into the active set (at most `max_active`, and
while KV room allows) → prefill chunks fill the iteration budget left after the decoding rows'
reserved tokens → the chunk that completes the prompt samples the first token → one decode token per
iteration → a finish (stop / length) or a cancel, after which the row and its KV leave the group.

Budget rule (the driver passes `max(max_iteration_tokens, running + minimum_preparation_tokens)` to
`advance_mixed`): every decoding row gets its token first; prompt chunks, oldest row first, fill the
rest. A prompt larger than any budget simply takes several iterations; it is never rejected for size.

Threading: all MLX work — prefix-cache take/put, the forward, sampling, detokenization — runs inside
one `context.run(step)` call per iteration on the engine thread, which returns plain Python results.
The event loop then publishes deltas with `send_nowait` into unbounded streams, so a slow consumer
never blocks the loop. The event loop only mutates the row lists (admit, prune, publish) between steps.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import replace
from typing import Any

import anyio
import mlx.core as mx
from engine.contracts import Delta, ExecutionContext, GenerationRequest
from engine.memory import MemoryBudget, release_free_memory
from engine.errors import ContextTooLong, EngineClosed, InvalidRequest, MemoryAdmission, QueueFull
from engine.pipeline import DecodePipeline
from engine.plan import ExecutionPlan, resolve_execution
from engine.rows import LLMRowStream, Row, plan_iteration
from engine.runner import PackedRunner, Segment, SeparateRunner, make_cache
from engine.sampling import RowSampler, StopMatcher, sample_rows, validate_sampling
from engine.tasks import ExecutionTasks

__all__ = ["LLMBatchGroup", "LLMRowStream", "Row"]

_log = logging.getLogger(__name__)


class LLMBatchGroup:
    """Continuous batching over an mlx-lm model; implements engine.contracts.ExecutionGroup."""

    admission_held = False

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
        prefix_cache: Any = None,
        plan: ExecutionPlan | None = None,
        max_kv_tokens: int | None = None,
        budget: MemoryBudget | None = None,
        max_queued: int | None = None,
    ) -> None:
        if max_active < 1 or max_iteration_tokens < 1 or minimum_preparation_tokens < 1:
            raise ValueError("max_active, max_iteration_tokens and minimum_preparation_tokens must be >= 1")
        if max_queued is not None and max_queued < 0:
            raise ValueError("max_queued must be >= 0 (None: unbounded)")
        self.model = model
        self.tokenizer = tokenizer
        self.context = context
        self.context_length = context_length
        self.max_active = max_active
        self.max_queued = max_queued  # rows waiting for admission beyond this are refused (QueueFull)
        self._max_iteration_tokens = max_iteration_tokens
        self._minimum_preparation_tokens = minimum_preparation_tokens
        self.prefix_cache = prefix_cache
        self.max_kv_tokens = max_kv_tokens
        self.budget = budget
        self._idle_released = True  # freed memory was given back since the last row ran
        self.plan = plan or resolve_execution(model)
        self.runner = PackedRunner(model) if self.plan.packed else SeparateRunner(model)
        self.slots = getattr(self.runner, "slots", None)  # decode rows' KV, one buffer per layer
        self.pipeline = DecodePipeline(lambda segments: self.runner.forward(segments), self.slots is not None)
        self.vocab_size = int(getattr(getattr(model, "args", None), "vocab_size", 0) or len(tokenizer))
        self.tasks = ExecutionTasks()
        self._queue: deque[Row] = deque()
        self._active: list[Row] = []
        self._wake = anyio.Event()
        self._closed = False
        self._recent: deque[tuple[float, int, int]] = deque()  # (time, prompt, generated) per iteration
        self.counters = {
            "iterations": 0, "mixed_iterations": 0, "prompt_tokens": 0, "generation_tokens": 0,
            "finished_rows": 0, "cancelled_rows": 0, "step_seconds": 0.0, "prompt_seconds": 0.0,
            "decode_seconds": 0.0, "loop_gap_seconds": 0.0, "publish_seconds": 0.0, "failed_steps": 0,
        }
        # Health: steps failed in a row (reset by any success) and the last failure, for /health.
        self.consecutive_failures = 0
        self.last_error: str | None = None
        self._last_step_end: float | None = None

    # -- submission -------------------------------------------------------------------------------

    def submit(self, request: GenerationRequest) -> LLMRowStream:
        """Queue a generation; returns its delta stream.

        Raises InvalidRequest for an empty prompt, token ids outside the vocabulary or max_tokens < 1,
        ContextTooLong when prompt + max_tokens exceeds the context, InvalidSampling for invalid sampling
        settings, EngineClosed when closed, QueueFull when max_queued rows already wait (engine/errors.py)."""
        if self._closed:
            raise EngineClosed("engine is shutting down")
        if self.max_queued is not None and (queued := self.queued_rows()) >= self.max_queued:
            raise QueueFull(f"{queued} requests are already waiting (limit {self.max_queued}); retry later",
                            queued=queued, limit=self.max_queued)
        prompt = [int(t) for t in request.prompt_tokens]
        if not prompt:
            raise InvalidRequest("the prompt is empty", param="prompt")
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise InvalidRequest(f"prompt token ids must be in 0..{self.vocab_size - 1}", param="prompt")
        if request.max_tokens < 1:
            raise InvalidRequest("max_tokens must be >= 1", param="max_tokens")
        if len(prompt) + request.max_tokens > self.context_length:
            raise ContextTooLong(
                f"prompt ({len(prompt)} tokens) + max_tokens ({request.max_tokens}) exceeds the context "
                f"length of {self.context_length} tokens"
            )
        validate_sampling(request.sampling, self.vocab_size)
        request = self._fit_budget(request, len(prompt))
        send, receive = anyio.create_memory_object_stream[Delta](math.inf)
        row = Row(
            request=request,
            send=send,
            sampler=RowSampler(request.sampling, prompt, self.vocab_size),
            stopper=StopMatcher(self.tokenizer, stop=request.stop, stop_token_ids=request.stop_token_ids,
                                max_tokens=request.max_tokens),
            prompt=prompt,
            boundaries=sorted(b for b in request.segment_boundaries if 0 < b < len(prompt)),
        )
        self._queue.append(row)
        self._wake_up()
        return LLMRowStream(row, receive, self._wake_up)

    # -- ExecutionGroup ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def max_iteration_tokens(self) -> int:
        return self._max_iteration_tokens

    @property
    def minimum_preparation_tokens(self) -> int:
        return self._minimum_preparation_tokens

    def prune(self) -> None:
        """Drop cancelled rows and queued tasks. A cancelled row's KV is released now, or handed to the
        prefix cache by a task the next iteration runs first. Raises nothing."""
        self.tasks.prune()
        self.pipeline.forget_if_done()
        for row in [r for r in self._queue if r.cancelled]:
            self._queue.remove(row)
            self._end(row, cancelled=True)
        for row in [r for r in self._active if r.cancelled]:
            self._active.remove(row)
            self._end(row, cancelled=True)

    def has_work(self) -> bool:
        return bool(self._active or any(not r.cancelled for r in self._queue) or self.tasks.pending)

    async def wait_for_work(self) -> None:
        """Return when a row or a task arrives, or the group closes. Raises nothing but cancellation."""
        if self.has_work() or self._closed:
            return
        if not self._idle_released:  # nothing runs: hand freed buffers back before sleeping
            self._idle_released = True
            await self.context.run(release_free_memory)
            if self.has_work() or self._closed:
                return
        async with anyio.create_task_group() as tg:

            async def watch(wait: Any) -> None:
                await wait()
                tg.cancel_scope.cancel()

            tg.start_soon(watch, self._wake.wait)
            # Bind the current event now: a task enqueued before `watch` starts must still wake us.
            tg.start_soon(watch, self.tasks._changed.wait)

    def admit(self) -> None:
        """Move queued rows into the active set while `max_active` and the KV budget allow."""
        while self._queue and len(self._active) < self.max_active:
            row = self._queue[0]
            if row.cancelled:
                self._queue.popleft()
                self._end(row, cancelled=True)
                continue
            if self.max_kv_tokens is not None and self._active:
                reserved = sum(len(r.prompt) + r.request.max_tokens for r in self._active)
                if reserved + len(row.prompt) + row.request.max_tokens > self.max_kv_tokens:
                    break
            if self.budget is not None and self._active and self.projected_kv_bytes([*self._active, row]) > self.budget.kv:
                break  # its KV does not fit next to the running rows: it waits for one to leave
            self._active.append(self._queue.popleft())

    def has_decoding(self) -> bool:
        return any(r.decoding for r in self._active)

    def has_preparing(self) -> bool:
        return any(r.preparing for r in self._active)

    def supports_mixed(self) -> bool:
        return self.plan.packed

    def running_tokens(self) -> int:
        return sum(1 for r in self._active if r.decoding)

    async def advance_mixed(self, budget: int) -> None:
        """One packed iteration: every decoding row plus prompt chunks filling the rest of `budget`."""
        await self._iterate(budget, decode=True, prefill=True)

    async def advance_preparation(self) -> None:
        """Prompt chunks (oldest row first) within max_iteration_tokens."""
        await self._iterate(max(self._max_iteration_tokens, 1), decode=False, prefill=True)

    async def advance(self) -> None:
        """One decode token for every decoding row."""
        await self._iterate(0, decode=True, prefill=False)

    def close(self) -> None:
        """Stop accepting work, end every row with finish_reason "cancelled", reject queued tasks."""
        self._closed = True
        for row in list(self._queue) + self._active:
            self._publish(row, Delta(finish_reason="cancelled", **self._usage(row)))
        self._queue.clear()
        self._active.clear()
        self.pipeline.reset()
        if self.slots is not None:
            self.slots.reset()
        self.tasks.reject_all()
        self.tasks._notify()
        self._wake_up()

    # -- stats ------------------------------------------------------------------------------------

    def kv_bytes(self) -> int:
        """Bytes held by active rows' KV caches. Raises nothing."""
        return self.row_cache_bytes() + (self.slots.used_nbytes if self.slots is not None else 0)

    def row_cache_bytes(self) -> int:
        """Bytes of the per-row (prefill) KV caches. Raises nothing."""
        return sum(getattr(c, "nbytes", 0) or 0 for row in list(self._active) for c in row.cache or ())

    def slot_bytes(self) -> int:
        """Bytes allocated for the decode slots, free ones included. Raises nothing."""
        return self.slots.nbytes if self.slots is not None else 0

    # -- memory -----------------------------------------------------------------------------------

    def projected_kv_bytes(self, rows: list[Row]) -> int:
        """The most KV memory `rows` can need together: every row in a slot as long as the longest may
        grow (slots padded to a power of two, positions step-rounded), plus prefill caches for the rows
        still preparing. Raises nothing."""
        if not rows or self.budget is None:
            return 0
        step = self.slots.step if self.slots is not None else 256
        longest = max(len(r.prompt) + r.request.max_tokens + 1 for r in rows)
        positions = -(-longest // step) * step
        slots = 1 << max(0, len(rows) - 1).bit_length()
        preparing = sum(-(-len(r.prompt) // 256) * 256 for r in rows if r.done < len(r.prompt))
        return self.budget.kv_token_bytes * (slots * positions + preparing)

    def reserved_kv_bytes(self) -> int:
        """`projected_kv_bytes` of the active rows: what admission counts as taken. Raises nothing."""
        return self.projected_kv_bytes(list(self._active))

    def _fit_budget(self, request: GenerationRequest, prompt: int) -> GenerationRequest:
        """Lower a defaulted max_tokens until the row fits the KV budget alone; refuse a row that cannot.
        Raises MemoryAdmission."""
        if self.budget is None:
            return request
        token, kv = self.budget.kv_token_bytes, self.budget.kv
        step = self.slots.step if self.slots is not None else 256
        # Alone: one slot of (prompt + max_tokens + 1) step-rounded positions, plus its prefill cache.
        positions = (kv // token - -(-prompt // 256) * 256) // step * step - 1
        if request.max_tokens_requested is False and positions - prompt >= 1:
            if request.max_tokens > positions - prompt:
                request = replace(request, max_tokens=positions - prompt)
            return request
        if prompt + request.max_tokens > positions:
            fits = max(0, positions - prompt)
            raise MemoryAdmission(
                code="context_over_budget", param="max_tokens", message=
                f"prompt ({prompt} tokens) + max_tokens ({request.max_tokens}) needs more KV memory than the "
                f"server's budget holds ({kv // token} tokens of KV in {kv >> 20} MiB); "
                + (f"at most {fits} new tokens fit after this prompt" if fits else "the prompt alone does not fit"))
        return request

    def recent_rates(self, window: float = 10.0) -> tuple[float, float]:
        """Wall-clock (prompt, generation) tokens/s over the last `window` seconds. Raises nothing."""
        now = time.monotonic()
        while self._recent and self._recent[0][0] < now - window:
            self._recent.popleft()
        if not self._recent:
            return 0.0, 0.0
        span = max(now - self._recent[0][0], 1e-3)
        return (round(sum(p for _, p, _ in self._recent) / span, 2),
                round(sum(g for _, _, g in self._recent) / span, 2))

    def active_rows(self) -> int:
        return len(self._active)

    def queued_rows(self) -> int:
        return sum(1 for r in self._queue if not r.cancelled)

    # -- the iteration ----------------------------------------------------------------------------

    async def _iterate(self, budget: int, *, decode: bool, prefill: bool) -> None:
        rows = [r for r in self._active if not r.cancelled]
        if not rows:
            return
        self._idle_released = False
        before = (self.counters["prompt_tokens"], self.counters["generation_tokens"])
        start = time.perf_counter()
        if self._last_step_end is not None and start - self._last_step_end < 1.0:
            self.counters["loop_gap_seconds"] += start - self._last_step_end  # event-loop time between steps
        try:
            outputs = await self.context.run(self._step, rows, budget, decode, prefill)
        except Exception as exc:  # one bad step fails the rows it touched, never the loop
            self._fail_step(rows, exc)
            return
        finally:
            self._last_step_end = time.perf_counter()
        self.consecutive_failures = 0
        self._recent.append((time.monotonic(), self.counters["prompt_tokens"] - before[0],
                             self.counters["generation_tokens"] - before[1]))
        for row, delta in outputs:
            self._publish(row, delta)
            if row.finished and row in self._active:
                self._active.remove(row)
        self.counters["publish_seconds"] += time.perf_counter() - self._last_step_end

    def _fail_step(self, rows: list[Row], exc: Exception) -> None:
        _log.exception("engine step failed for %d row(s)", len(rows), exc_info=exc)
        self.counters["failed_steps"] += 1
        self.consecutive_failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        self.pipeline.reset()
        for row in rows:
            self._release(row)
            self._publish(row, Delta(finish_reason="error", error=self.last_error, **self._usage(row)))
        self._active = [r for r in self._active if r not in rows]

    def healthy(self) -> bool:
        """False once several steps in a row failed with no success since (the engine cannot run rows).
        Raises nothing."""
        return self.consecutive_failures < 3

    def _step(self, rows: list[Row], budget: int, decode: bool, prefill: bool) -> list[tuple[Row, Delta]]:
        """Engine thread: one forward over the planned segments, sampling, detokenization."""
        t0 = time.perf_counter()
        outputs: list[tuple[Row, Delta | None]] = []
        if self.pipeline.inflight is not None and not (decode and self.pipeline.continues(rows)):
            outputs = [(r, self._accept(r, t)) for r, t in self.pipeline.drain()]  # rows changed: no speculation
            rows = [r for r in rows if not r.finished]
        self._size_slots(rows)
        for row in rows:
            if row.cache is None and row.slot is None:
                self._attach_cache(row)
            elif self.slots is not None and row.decoding and row.slot is None:
                row.slot, row.cache = self.slots.adopt(row.cache), None  # type: ignore[arg-type]
        if decode and self.pipeline.eligible(rows):
            ordered, ids = self.pipeline.step(rows)  # step N+1 launched before step N's tokens are read
            outputs += [(r, self._accept(r, t)) for r, t in zip(ordered, ids)]
            return self._finish_step(t0, outputs, 0, len(ordered))
        if not (plan := plan_iteration(rows, budget, decode, prefill)):
            return self._finish_step(t0, outputs, 0, 0)
        segments = [Segment(tokens, r.cache, want, r.slot) for r, tokens, want in plan]
        logits = self.runner.forward(segments)
        sampled_rows = [r for r, _, want in plan if want]
        tokens = sample_rows(logits, [r.sampler for r in sampled_rows]) if sampled_rows else None
        # Sampled rows' KV updates are ancestors of their tokens; only chunks without logits need naming.
        touched = [a for s in segments if not s.logits for c in s.cache or () for a in (c.keys, c.values)]
        mx.eval(([tokens] if tokens is not None else []) + touched)
        ids = tokens.tolist() if tokens is not None else []
        n_prompt, n_decode = 0, sum(1 for r, _, _ in plan if not r.preparing)
        for r, chunk, _ in plan:
            if r.preparing:
                r.done, n_prompt = r.done + len(chunk), n_prompt + len(chunk)
                self._boundary_puts(r, r.done - len(chunk))
        outputs += [(r, self._accept(r, t)) for r, t in zip(sampled_rows, ids)]
        return self._finish_step(t0, outputs, n_prompt, n_decode)

    def _size_slots(self, rows: list[Row]) -> None:
        """Engine thread, no step in flight: cap slot growth at what the rows reserved, and shrink the
        buffers to the rows left once they hold twice what those need."""
        slots = self.slots
        if slots is None or self.pipeline.inflight is not None:
            return
        slots.ceiling = max((len(r.prompt) + r.request.max_tokens + 1 for r in rows), default=None)
        holders = {r.slot: r for r in rows if r.slot is not None}
        if slots.oversized() and set(holders) == set(slots.lengths):  # every slot's row is here to renumber
            for old, new in slots.compact().items():
                holders[old].slot = new

    def _finish_step(self, t0: float, outputs: list[Any], n_prompt: int, n_decode: int) -> list[tuple[Row, Delta]]:
        self._reclaim()
        dt, n_gen = time.perf_counter() - t0, len(outputs)
        total = max(n_prompt + n_gen, 1)  # the step's time is split by token share (prompt vs generation rates)
        for key, add in (("iterations", 1), ("mixed_iterations", int(n_prompt > 0 and n_decode > 0)),
                         ("prompt_tokens", n_prompt), ("generation_tokens", n_gen), ("step_seconds", dt),
                         ("prompt_seconds", dt * n_prompt / total), ("decode_seconds", dt * n_gen / total)):
            self.counters[key] += add
        return [(r, d) for r, d in outputs if d is not None]

    def _accept(self, row: Row, token: int) -> Delta | None:
        try:
            return self._take_token(row, token)
        except Exception as exc:  # this row's own fault (detokenizer, stop matcher): only it ends
            _log.exception("row failed on token %d", token)
            row.finished = True
            self._release(row)
            return Delta(finish_reason="error", error=f"{type(exc).__name__}: {exc}", **self._usage(row))

    def _take_token(self, row: Row, token: int) -> Delta | None:
        row.sampler.accept(token)
        row.generated.append(token)
        row.last_token = token
        row.unsent_ids.append(token)
        at_limit = len(row.prompt) + len(row.generated) >= self.context_length
        step = row.stopper.add(token, at_context_limit=at_limit)
        if step.finish_reason is not None:
            row.finished = True
            self._put(row)  # its KV goes to the prefix cache (cut to the fed tokens) and the slot is freed
        elif not step.text:
            return None  # held back (partial character or possible stop string): nothing to show yet
        ids, row.unsent_ids = row.unsent_ids, []
        return Delta(text=step.text, token_ids=ids, finish_reason=step.finish_reason, **self._usage(row))

    def _usage(self, row: Row) -> dict[str, int]:
        return {"prompt_tokens": len(row.prompt), "completion_tokens": len(row.generated),
                "cached_tokens": row.cached_tokens}

    # -- prefix cache seam ------------------------------------------------------------------------

    def _attach_cache(self, row: Row) -> None:
        if self.prefix_cache is not None:
            try:
                n, kv = self.prefix_cache.take(row.request.namespace, row.prompt, row.request.session_id)
            except Exception:  # a cache problem costs a cold prefill, never the request
                _log.exception("prefix cache take failed")
                n, kv = 0, None
            if kv is not None and 0 < n < len(row.prompt):
                row.cache, row.done, row.cached_tokens = list(kv), n, n
                return
        row.cache = make_cache(self.model)

    def _boundary_puts(self, row: Row, before: int) -> None:
        if self.prefix_cache is None:
            return
        for b in row.boundaries:
            if before < b <= row.done:
                self.prefix_cache.put(row.request.namespace, row.prompt[:b], row.cache, row.request.session_id,
                                      system_prefix=True)

    def _put(self, row: Row) -> None:
        if self.prefix_cache is not None and (row.cache is not None or row.slot is not None) and row.done > 0:
            try:
                fed = row.fed_tokens()  # a speculative step may have written one more position: cut it
                kv = row.cache if row.slot is None else self.slots.export(row.slot, len(fed))  # type: ignore
                self.prefix_cache.put(row.request.namespace, fed, kv, row.request.session_id)
            except Exception:  # a cache problem must never fail the request
                _log.exception("prefix cache put failed")
        self._release(row)

    def _release(self, row: Row) -> None:
        if row.slot is not None and self.slots is not None:
            self.slots.release(row.slot)
        row.cache, row.slot = None, None

    def _reclaim(self) -> None:
        if self.prefix_cache is not None:
            self.prefix_cache.reclaim()

    # -- event-loop side --------------------------------------------------------------------------

    def _publish(self, row: Row, delta: Delta) -> None:
        if delta.finish_reason is not None:
            row.finished = True
        if not row.cancelled:
            try:
                row.send.send_nowait(delta)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                row.cancelled = True  # nobody is listening any more
        if delta.finish_reason is not None:
            row.send.close()
            self.counters["finished_rows"] += 1

    def _end(self, row: Row, *, cancelled: bool) -> None:
        row.finished = True
        row.send.close()
        if cancelled:
            self.counters["cancelled_rows"] += 1
        if (row.cache is not None or row.slot is not None) and self.prefix_cache is not None and row.done > 0:
            # Its KV still helps the next turn: stored by a task on the engine thread before the next step.
            self.tasks.enqueue(lambda: self._put(row), label="prefix-cache put")
        else:
            self._release(row)

    def _wake_up(self) -> None:
        self._wake.set()
        self._wake = anyio.Event()
