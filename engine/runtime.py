"""Engine — the facade the HTTP layer and the CLI use: one engine thread, one driver loop, one group.

    engine = Engine(loaded, max_active=16, max_iteration_tokens=512)
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        async with engine.submit(request) as stream:
            async for delta in stream: ...
        engine.close()

Speech work (Whisper windows, model loads) goes through `engine.tasks`, which the same loop runs
between LLM iterations. With `loaded=None` the group is a TasksOnlyGroup (a speech-only server).
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import anyio

from engine.batch import LLMBatchGroup, LLMRowStream
from engine.accelerator import apply_serving_defaults
from engine.context import EngineThread
from engine.contracts import Delta, GenerationRequest, GrammarSpec
from engine.driver import drive_execution_group
from engine.engine_stats import group_stats, memory_stats
from engine.memory import MemoryBudget, configure_allocator
from engine.errors import EngineClosed, NoChatModel
from engine.gil import gil_switch_seconds
from engine.pacing import DECODE_BURST, STALL, minimum_chunk_default
from engine.plan import ExecutionPlan, resolve_execution
from engine.task_group import TasksOnlyGroup
from engine.tasks import ExecutionTasks

if TYPE_CHECKING:
    from engine.models import LoadedModel

__all__ = ["Engine", "GenerationResult", "generate_stream"]


class Engine:
    """Owns the engine thread, the execution lease and the group the driver loop advances."""

    def __init__(
        self,
        loaded: "LoadedModel | None",
        *,
        max_active: int = 16,
        max_iteration_tokens: int = 512,
        minimum_preparation_tokens: int | None = None,
        prefill_stall: float = STALL,
        prefix_cache: Any = None,
        backend: Any = None,
        max_kv_tokens: int | None = None,
        thread: EngineThread | None = None,
        memory_budget: int | None = None,
        max_queued: int | None = None,
        decode_burst: int = DECODE_BURST,
        prefill_lane: bool | None = None,
    ) -> None:
        """`max_kv_tokens` caps the sum of (prompt + max_tokens) over active rows (None = only max_active).
        `thread`: the engine thread to run on (the one the model was loaded on; see `open`).
        `memory_budget`: bytes for weights, KV, the prefix cache and MLX's buffer cache (None: the
        machine's default, engine.memory). `max_queued`: requests that may wait for admission before submit
        raises QueueFull (a request's choices, one GenerationRequest.origin, count once; None: unbounded).
        `decode_burst`: decode steps the engine thread may run back to back while nothing else waits (1: return to
        the event loop after every step). `prefill_lane`: prompt chunks on a second engine thread beside the decode
        steps (None: on a GPU; engine/batch.py). `minimum_preparation_tokens`:
        the fewest prompt tokens a mixed iteration carries (None: engine/pacing.py's default). Raises ValueError for
        non-positive limits, a budget that leaves no room for KV, or a bad TANDEM_GIL_SWITCH_MS."""
        apply_serving_defaults()
        self.gil_switch = gil_switch_seconds()
        self.thread = thread or EngineThread()
        self.lease = anyio.Lock()
        self.loaded = loaded
        self.prefix_cache = prefix_cache
        self._serving = False
        self._closed = False
        if loaded is None:
            self.tokenizer = None
            self.model_name: str | None = None
            self.model_root: str | None = None  # vLLM's `root`: where the model comes from (LoadedModel.root)
            self.context_length: int | None = None
            self.max_model_len: int | None = None
            self.plan: ExecutionPlan | None = None
            self.budget: MemoryBudget | None = None
            self.group: LLMBatchGroup | TasksOnlyGroup = TasksOnlyGroup()
        else:
            self.tokenizer = loaded.tokenizer
            self.model_name = loaded.name
            self.model_root = getattr(loaded, "root", None)  # stand-ins (tests, bench) may lack it
            self.context_length = int(loaded.context_length)
            self.plan = resolve_execution(loaded.model, backend if backend is not None else _blas())
            self.budget = MemoryBudget.plan(
                loaded.model, total=memory_budget, prefix_cache=prefix_cache.max_bytes if prefix_cache else 0,
                max_iteration_tokens=max_iteration_tokens, max_active=max_active)
            self.group = LLMBatchGroup(
                loaded.model,
                loaded.tokenizer,
                self.thread,
                context_length=self.context_length,
                max_active=max_active,
                max_iteration_tokens=max_iteration_tokens,
                minimum_preparation_tokens=(minimum_chunk_default() if minimum_preparation_tokens is None
                                            else minimum_preparation_tokens),
                prefill_stall=prefill_stall,
                prefix_cache=prefix_cache,
                plan=self.plan,
                max_kv_tokens=max_kv_tokens,
                budget=self.budget,
                max_queued=max_queued,
                decode_burst=decode_burst,
                prefill_lane=prefill_lane,
            )
            # What one request (prompt + max_tokens) can really use: the memory budget may hold less KV than the
            # model's context (--memory-budget 900M: 1,279 of 8,192), and clients size their prompts by it.
            self.max_model_len = self.context_length
            if (admission := self.group.admission) is not None:
                self.max_model_len = min(self.context_length, admission.longest_request())
        self.tasks: ExecutionTasks = self.group.tasks

    @property
    def sampling_defaults(self) -> dict[str, float]:
        """The model's recommended sampling settings (its generation_config.json) for fields a request leaves out;
        empty without a chat model or a recommendation. Raises nothing."""
        return dict(getattr(self.loaded, "sampling_defaults", None) or {})

    @property
    def vocab_size(self) -> int | None:
        """Token ids the model accepts (its embedding may be larger than the tokenizer); None without a
        chat model. Raises nothing."""
        return self.group.vocab_size if isinstance(self.group, LLMBatchGroup) else None

    @classmethod
    async def open(cls, spec: str | None, *, prompt_cache_bytes: int | None = None, chat_template: str | None = None,
                   adapter_path: str | None = None, **options: Any) -> "Engine":
        """Load model `spec` on a new engine thread and build the engine on that same thread, so every array the
        model holds belongs to the thread that runs it (`chat_template` replaces the checkpoint's; `adapter_path`
        applies a fine-tune's adapter). The prefix cache gets `prompt_cache_bytes` (None: its share of the memory
        budget; 0: no prefix cache). `options` go to `Engine(...)`. Raises what engine.models.load_model raises (the
        thread is closed then), and ValueError for a budget that leaves no room for KV."""
        from engine.models import load_model
        from engine.prefix_cache import PrefixCache

        apply_serving_defaults()  # some are read when MLX first touches the device, i.e. during the load
        thread = EngineThread()
        try:
            # The budget decides whether the CPU's float32 weights fit, or quantized ones stay quantized.
            loaded = await thread.run(functools.partial(
                load_model, spec, chat_template=chat_template, adapter_path=adapter_path,
                memory_budget=options.get("memory_budget"), max_active=options.get("max_active", 16),
                max_iteration_tokens=options.get("max_iteration_tokens", 512)))
            if prompt_cache_bytes is None:
                prompt_cache_bytes = MemoryBudget.plan(
                    loaded.model, total=options.get("memory_budget"),
                    max_iteration_tokens=options.get("max_iteration_tokens", 512),
                    max_active=options.get("max_active", 16)).prefix_cache
            cache = PrefixCache(prompt_cache_bytes) if prompt_cache_bytes > 0 else None
            return cls(loaded, thread=thread, prefix_cache=cache, **options)
        except BaseException:
            thread.close()
            raise

    def prepare_grammar(self, spec: GrammarSpec) -> None:
        """Build a constrained reply's matchers now, off the event loop (service/seams.py); the first also reads the
        tokenizer into llguidance (~0.4 s at 49k tokens), which no server start pays. Raises ConstraintError."""
        if isinstance(self.group, LLMBatchGroup):
            self.group.constraints.prepare(spec)

    async def serve(self) -> None:
        """Run the driver loop until `close()`; run it inside a task group. Raises EngineClosed if the
        engine was closed already."""
        if self._closed:
            raise EngineClosed("engine is closed")
        self._serving = True
        # The engine thread shares the GIL with the event loop; the interval is how long either waits before it
        # makes the other let go (engine/gil.py says why this one).
        switch = sys.getswitchinterval()
        sys.setswitchinterval(self.gil_switch)
        try:
            if self.budget is not None:
                await self.thread.run(configure_allocator, self.budget)
            await drive_execution_group(self.group, self.lease, self.thread)
        finally:
            if isinstance(self.group, LLMBatchGroup):
                self.group.step.reset()  # nothing runs on the engine thread now: its slots and pipeline go
            sys.setswitchinterval(switch)
            self._serving = False
            self.thread.close()
            if isinstance(self.group, LLMBatchGroup) and self.group.lane is not None:
                self.group.lane.close()  # the prefill lane's thread used MLX too: joined before the process ends

    def submit(self, request: GenerationRequest) -> LLMRowStream:
        """Queue a generation; iterate the returned stream for deltas, `aclose()` it to cancel.

        Raises ContextTooLong, InvalidRequest (empty prompt, ids outside the vocabulary), InvalidSampling,
        NoChatModel when no chat model is loaded, EngineClosed when closed and QueueFull when max_queued
        requests already wait (engine/errors.py)."""
        if not isinstance(self.group, LLMBatchGroup):
            raise NoChatModel("no chat model is loaded")
        return self.group.submit(request)

    async def warm_up(self, report: Callable[[str], None] | None = None, *, force: bool | None = None) -> float:
        """Compile what serving needs before clients wait for it (engine/warmup.py); `serve()` must be
        running. `force` None warms up on a GPU only (the CPU compiles nothing per shape). Returns the
        seconds taken (0 when skipped). Raises RuntimeError when a warm-up row fails."""
        import mlx.core as mx

        from engine.warmup import warm_up

        if force is False or (force is None and mx.default_device() != mx.gpu):
            return 0.0
        if self.tokenizer is None or not isinstance(self.group, LLMBatchGroup):
            return 0.0  # no chat model: nothing to compile
        return await warm_up(self.submit, self.group, report)

    def stats(self) -> dict[str, Any]:
        """A plain-data snapshot for /stats. Raises nothing."""
        out: dict[str, Any] = {
            "model": self.model_name,
            "context_length": self.context_length,
            "max_model_len": self.max_model_len,
            "engine_busy_seconds": round(self.thread.busy_seconds, 3),
            "tasks": {"queued": len(self.tasks), "completed": self.tasks.completed, "labels": self.tasks.labels()},
            "plan": self.plan.as_dict() if self.plan else None,
        }
        group = self.group
        if isinstance(group, LLMBatchGroup):
            out.update(group_stats(group))
            out["memory"] = self.memory_stats()
        else:
            out.update(active_rows=0, queued_rows=0, kv_bytes=0, iterations=0)
        if self.prefix_cache is not None and hasattr(self.prefix_cache, "stats"):
            try:
                out["prefix_cache"] = self.prefix_cache.stats()
            except Exception:  # stats must never fail /stats
                out["prefix_cache"] = None
        return out

    def chat_pace(self) -> float | None:
        """Seconds a decode-only chat iteration takes (a moving average), or None while chat has no row,
        active or queued: what other work on the loop (Whisper steps) should stay well below. A row still in
        its prompt counts: a full-budget step planned then would land on its first token gaps. Raises nothing."""
        group = self.group
        if not isinstance(group, LLMBatchGroup) or (group.active_rows() == 0 and group.queued_rows() == 0):
            return None
        return group.pacer.decode_seconds

    async def chat_turn(self) -> None:
        """Return once the next chat step has landed, or at once while chat has no row (with TANDEM_SPEECH_TURNS=on
        Whisper steps take turns with chat's: audio/scheduler.py). Event loop. Raises nothing but cancellation."""
        group = self.group
        if isinstance(group, LLMBatchGroup) and not group.closed and (group.active_rows() or group.queued_rows()):
            await group.landed.wait()  # it also fires when chat goes idle or the group closes meanwhile

    def health(self) -> dict[str, Any]:
        """{"ok": False, "error": ...} once several engine steps in a row failed with no success since
        (the engine cannot run rows), or while rows wait and no step has landed for STALL_SECONDS (a stuck engine);
        {"ok": True} otherwise. Raises nothing."""
        group = self.group
        if isinstance(group, LLMBatchGroup):
            return group.health.report(group.active_rows() + group.queued_rows())
        return {"ok": True}

    def memory_stats(self) -> dict[str, Any]:
        """The budget and what each part holds now, in bytes. Raises nothing."""
        return memory_stats(self.budget, self.group, self.prefix_cache)

    def refuse_queued(self) -> int:
        """Shutting down: chat rows still queued end now as cancelled, running ones go on, new ones are refused
        (engine/batch.py). Returns how many were waiting. Raises nothing."""
        group = self.group
        return group.refuse_queued() if isinstance(group, LLMBatchGroup) else 0

    def close(self) -> None:
        """Stop the loop: rows end with finish_reason "cancelled", queued tasks are rejected. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.group.close()
        if not self._serving:
            self.thread.close()


def _blas() -> Any:
    try:
        from engine.backend import blas_info

        return blas_info()
    except Exception:  # the plan only reports it
        return None


@dataclass
class GenerationResult:
    """A whole generation: the text, its token ids, and the final delta's counts and finish_reason."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None


async def generate_stream(
    engine: Engine, request: GenerationRequest, on_delta: Callable[[Delta], None] | None = None
) -> GenerationResult:
    """Run one generation without a server: starts the loop, streams deltas to `on_delta`, closes the
    engine. Use with `anyio.run(generate_stream, engine, request, print_fn)`.

    Raises what `Engine.submit` raises, and RuntimeError with the engine's message if the step failed."""
    result = GenerationResult()
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        try:
            async with engine.submit(request) as stream:
                async for delta in stream:
                    if on_delta is not None:
                        on_delta(delta)
                    result.text += delta.text
                    result.token_ids += delta.token_ids
                    result.finish_reason = delta.finish_reason or result.finish_reason
                    result.prompt_tokens = delta.prompt_tokens
                    result.completion_tokens = delta.completion_tokens
                    result.cached_tokens = delta.cached_tokens
                    result.error = delta.error
        finally:
            engine.close()
    if result.error:
        raise RuntimeError(result.error)
    return result
