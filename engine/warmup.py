"""Warm-up: a few internal generations through every path the loop takes, before clients arrive.

MLX on CUDA compiles a kernel the first time it meets an op, dtype or fused graph, and builds a CUDA graph
the first time it meets an iteration's op sequence: left to the first clients, that costs seconds of
time-to-first-token, and a module compiled while serving stalls every stream (one process-wide lock). The rows
below cover one row alone, concurrent rows, chunked prefill beside decode (packed mixed iterations), the
pipelined decode and rows leaving it, each sampler kind (log probabilities too) and a prefix-cache hit.
"""

from __future__ import annotations

import time
from typing import Callable

import anyio

from engine.batch import LLMBatchGroup, LLMRowStream
from engine.contracts import GenerationRequest, SamplingParams
from engine.iteration_times import IterationTimes
from engine.pacing import PrefillPacer

__all__ = ["warm_up", "WARMUP_NAMESPACE"]

WARMUP_NAMESPACE = "tandem-warmup"  # its prefix-cache entries never match a client's prompt

_SAMPLERS = (
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.8, top_p=0.9),
    SamplingParams(temperature=0.7, top_k=20, min_p=0.05),
    SamplingParams(temperature=0.6, repetition_penalty=1.1, presence_penalty=0.2, logit_bias={1: -1.0}),
)


_LOGPROBS = (
    SamplingParams(temperature=0.0, logprobs=5),
    SamplingParams(temperature=0.0, logprobs=0),
    SamplingParams(temperature=0.7, top_k=20, logprobs=2),
)


def _prompt(length: int, salt: int, vocab: int) -> list[int]:
    return [1 + (salt * 7919 + i * 104729) % (vocab - 2) for i in range(length)]


async def warm_up(submit: Callable[[GenerationRequest], LLMRowStream], group: LLMBatchGroup, report: Callable[[str], None] | None = None) -> float:
    """Run the warm-up rows through `submit` on a serving engine whose LLM group is `group` (its `serve()`
    must be running); returns the seconds it took. The group's counters, iteration times and pacer are reset
    afterwards (compiles are not serving costs), so /stats and the pacing see client work only. Raises RuntimeError when a warm-up row fails (the engine cannot serve)."""
    vocab = int(group.vocab_size)
    chunk = int(group.max_iteration_tokens)
    t0 = time.perf_counter()

    async def run(prompt: list[int], sampling: SamplingParams, max_tokens: int) -> None:
        request = GenerationRequest(prompt, sampling, max_tokens=max_tokens, namespace=WARMUP_NAMESPACE)
        async with submit(request) as stream:
            async for delta in stream:
                if delta.error:
                    raise RuntimeError(f"warm-up generation failed: {delta.error}")

    stages = [
        ("one row", [(_prompt(5, 0, vocab), _SAMPLERS[0], 6)]),
        ("concurrent rows, chunked prefill beside decode",
         [(_prompt(n, i + 1, vocab), _SAMPLERS[i % len(_SAMPLERS)], 8)
          for i, n in enumerate((3, 17, 70, chunk + chunk // 2))]),
        ("prefix-cache hit", [(_prompt(5, 0, vocab) + _prompt(9, 9, vocab), _SAMPLERS[0], 4)]),
        # Rows that decode together and finish one after another: the next step takes the tokens in flight of the
        # rows left (a gather of sampled ids). Missed here, it compiled while serving (H200: a 3 s stall, c8).
        ("rows leaving a pipelined decode", [(_prompt(4, 20, vocab), _SAMPLERS[0], n) for n in (3, 6, 9)]),
        # Log probabilities: rows in the shared draw (one set of ops over them) and one sampled alone. Missed here,
        # their ops compiled under the first client that asked (H200: 8 of 64 requests past their budget, c8).
        ("log probabilities", [(_prompt(6, 30 + i, vocab), sampling, 5) for i, sampling in enumerate(_LOGPROBS)]),
        # Every row asking, pipelined (one block over all the rows, no pick), then one leaving.
        ("log probabilities, pipelined", [(_prompt(5, 40 + i, vocab), _LOGPROBS[i], n) for i, n in ((0, 8), (1, 5))]),
    ]
    for label, rows in stages:
        if report is not None:
            report(f"warm-up: {label}")
        t_stage = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for prompt, sampling, n in rows:
                tg.start_soon(run, prompt, sampling, n)
        if report is not None:  # where a start's time goes (a GPU host compiles kernels in most stages)
            report(f"warm-up: {label}: {time.perf_counter() - t_stage:.1f} s")
    await group.settled()  # the last rows' final step lands first: its counts belong to the warm-up
    forget_measurements(group)
    return time.perf_counter() - t0


def forget_measurements(group: LLMBatchGroup) -> None:
    """Zero the group's counters and drop its iteration times and the pacer's estimates: a warm-up's compiles are
    not serving costs. Event loop, between iterations. Raises nothing."""
    for key in group.counters:
        group.counters[key] = type(group.counters[key])()
    group.iteration_times = IterationTimes()
    group.pacer = PrefillPacer(group.pacer.max_tokens, group.pacer.min_tokens, group.pacer.stall)
