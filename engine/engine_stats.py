"""The engine's counters as /stats shows them: the batch group's work, pacing and lanes, and where memory goes."""

from __future__ import annotations

from typing import Any

from engine.batch import LLMBatchGroup
from engine.blas_threads import threads_now
from engine.memory import MemoryBudget, process_rss
from engine.task_group import TasksOnlyGroup

__all__ = ["group_stats", "memory_stats"]


def group_stats(group: LLMBatchGroup) -> dict[str, Any]:
    """A plain-data snapshot of a chat group's rows, counters, pacing, bursts, compiled steps and prefill lane.
    Raises nothing."""
    c = group.counters
    out: dict[str, Any] = dict(
        active_rows=group.active_rows(),
        queued_rows=group.queued_rows(),
        max_active=group.max_active,
        max_iteration_tokens=group.max_iteration_tokens,
        kv_bytes=group.kv_bytes(),
        iterations=c["iterations"],
        mixed_iterations=c["mixed_iterations"],
        prompt_tokens=c["prompt_tokens"],
        generation_tokens=c["generation_tokens"],
        finished_rows=c["finished_rows"],
        cancelled_rows=c["cancelled_rows"],
        failed_steps=c["failed_steps"],
        # Where an iteration's wall time goes: the engine thread's step, publishing deltas, and the
        # event loop's other work before the next step starts.
        step_seconds=round(c["step_seconds"], 3),
        publish_seconds=round(c["publish_seconds"], 3),
        loop_gap_seconds=round(c["loop_gap_seconds"], 3),
        prompt_tokens_per_second=_rate(c["prompt_tokens"], c["prompt_seconds"]),
        generation_tokens_per_second=_rate(c["generation_tokens"], c["decode_seconds"]),
    )
    out["blas_threads"] = threads_now()  # OpenBLAS's threads now: they follow chat (engine/blas_threads.py)
    pacer = group.pacer  # what prefill pacing has learned (engine/pacing.py)
    out["pacing"] = {"stall": pacer.stall, "decode_ms": _ms(pacer.decode_seconds),
                     "fixed_ms": _ms(pacer.fixed_seconds),
                     "token_us": _ms(pacer.token_seconds, 1e6)}
    out["iteration_times"] = group.iteration_times.snapshot()
    # Decode steps the engine thread ran back to back (engine/burst.py): steps / bursts is how far
    # one went before a request, a task, a finish or a busy loop ended it.
    out["decode_bursts"] = {"limit": group.bursts.limit, "bursts": int(c["bursts"]),
                            "steps": int(c["burst_steps"])}
    # Decode-only steps run mx.compile'd per shape (engine/compiled_decode.py): shapes traced, and what those
    # traces cost the steps that made them.
    compiled = getattr(group.step.runner, "compiled", None)
    out["compiled_decode"] = {"on": compiled is not None, "traces": compiled.traces if compiled else 0,
                              "trace_seconds": round(compiled.trace_seconds, 3) if compiled else 0.0,
                              "fused_steps": compiled.fused_steps if compiled else 0}
    # Prompt chunks on their own engine thread beside the decode steps (engine/batch.py), where on.
    # waits_for_decode: the lane's pauses while a decode step was being built (engine/lane.py DecodeFirst).
    lane = group.lane
    out["prefill_lane"] = {"on": lane is not None, "chunks": int(c["lane_chunks"]),
                           "busy_seconds": round(lane.thread.busy_seconds, 3) if lane else 0.0,
                           "waits_for_decode": lane.turns.waits if lane else 0,
                           "waited_for_decode_seconds": round(lane.turns.waited_seconds, 3) if lane else 0.0,
                           "phase_seconds": {k: round(v, 6) for k, v in phases.seconds.items()}
                           if (phases := group.step.lane_phases) is not None else {},
                           "phase_cpu_seconds": {k: round(v, 6) for k, v in phases.cpu_seconds.items()}
                           if phases is not None else {}}
    recent_prompt, recent_generation = group.recent.rates()
    out["recent"] = {"window_seconds": 10.0, "prompt_tokens_per_second": recent_prompt,
                     "generation_tokens_per_second": recent_generation}
    return out


def memory_stats(budget: MemoryBudget | None, group: LLMBatchGroup | TasksOnlyGroup,
                 prefix_cache: Any) -> dict[str, Any]:
    """The budget (None: no chat model) and what each part holds now, in bytes. Raises nothing."""
    import mlx.core as mx

    out: dict[str, Any] = {"budget": budget.as_dict() if budget else None}
    if isinstance(group, LLMBatchGroup):
        out.update(slot_bytes=group.slot_bytes(), row_cache_bytes=group.row_cache_bytes(),
                   reserved_kv_bytes=group.reserved_kv_bytes())
    stats = getattr(prefix_cache, "stats", None)
    try:
        out["prefix_cache_bytes"] = int(stats()["bytes"]) if stats else 0
    except Exception:  # stats must never fail /stats
        out["prefix_cache_bytes"] = None
    out.update(weights_bytes=budget.weights if budget else 0,
               mlx_active_bytes=mx.get_active_memory(), mlx_cache_bytes=mx.get_cache_memory(),
               mlx_peak_bytes=mx.get_peak_memory(), process_rss_bytes=process_rss())
    return out


def _ms(seconds: float | None, scale: float = 1e3) -> float | None:
    return None if seconds is None else round(seconds * scale, 3)


def _rate(tokens: float, seconds: float) -> float:
    return round(tokens / seconds, 2) if seconds > 0 else 0.0
