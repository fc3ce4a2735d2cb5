"""Host and device cost of a draw's log-probability ops, by formulation (engine/sampling.py's LogprobBlock).

    python -m bench.logprob_ops [--vocab 49152] [--rows 1,8,64] [--k 5] [--steps 200]

Each formulation computes, for m rows of bf16 logits: the sampled token's log probability, and the k likeliest ids
and log probabilities in order. Per formulation and row count: the host's time to build and launch the ops
(`mx.async_eval`), and the wall time per step with the results read back, medians over `--steps`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import mlx.core as mx

Ops = Callable[[mx.array, mx.array, int], tuple[mx.array, ...]]


def partition_then_sort(logits: mx.array, tokens: mx.array, k: int) -> tuple[mx.array, ...]:
    """Log-softmax over the vocabulary, argpartition for the k, argsort of those k."""
    logp = logits.astype(mx.float32)
    logp = logp - mx.logsumexp(logp, axis=-1, keepdims=True)
    chosen = mx.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    ids = mx.argpartition(-logp, k - 1, axis=-1)[:, :k]
    values = mx.take_along_axis(logp, ids, axis=-1)
    order = mx.argsort(-values, axis=-1)
    return chosen, mx.take_along_axis(ids, order, axis=-1), mx.take_along_axis(values, order, axis=-1)


def one_sort(logits: mx.array, tokens: mx.array, k: int) -> tuple[mx.array, ...]:
    """One argsort over the vocabulary; values shifted by the log-sum-exp only where read."""
    x = logits.astype(mx.float32)
    lse = mx.logsumexp(x, axis=-1, keepdims=True)
    chosen = (mx.take_along_axis(x, tokens[:, None], axis=-1) - lse)[:, 0]
    ids = mx.argsort(-x, axis=-1)[:, :k]
    return chosen, ids, mx.take_along_axis(x, ids, axis=-1) - lse


def partition_lean(logits: mx.array, tokens: mx.array, k: int) -> tuple[mx.array, ...]:
    """argpartition over the raw logits (same order), argsort of the k; the log-sum-exp subtracted at the end."""
    x = logits.astype(mx.float32)
    lse = mx.logsumexp(x, axis=-1, keepdims=True)
    chosen = (mx.take_along_axis(x, tokens[:, None], axis=-1) - lse)[:, 0]
    ids = mx.argpartition(-x, k - 1, axis=-1)[:, :k]
    top = mx.take_along_axis(x, ids, axis=-1)
    order = mx.argsort(-top, axis=-1)
    return chosen, mx.take_along_axis(ids, order, axis=-1), mx.take_along_axis(top, order, axis=-1) - lse


FORMS: dict[str, Ops] = {"partition_then_sort": partition_then_sort, "one_sort": one_sort,
                         "partition_lean": partition_lean}


def measure(ops: Ops, rows: int, vocab: int, k: int, steps: int) -> dict[str, float]:
    logits = mx.random.normal((rows, vocab)).astype(mx.bfloat16)
    tokens = mx.argmax(logits, axis=-1)
    mx.eval(logits, tokens)
    launch, wall = [], []
    for i in range(steps + 10):
        t0 = time.perf_counter()
        out = ops(logits, tokens, k)
        mx.async_eval(*out)
        t1 = time.perf_counter()
        [a.tolist() for a in out]
        t2 = time.perf_counter()
        if i >= 10:  # first calls compile
            launch.append(t1 - t0)
            wall.append(t2 - t0)
    return {"launch_ms": round(statistics.median(launch) * 1e3, 4), "wall_ms": round(statistics.median(wall) * 1e3, 4)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--rows", default="1,8,64")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--steps", type=int, default=200)
    a = p.parse_args()
    # Same answers first (ids may differ only among equal values; random normals have none).
    logits = mx.random.normal((4, a.vocab)).astype(mx.bfloat16)
    tokens = mx.argmax(logits, axis=-1)
    ref = [x.tolist() for x in partition_then_sort(logits, tokens, a.k)]
    for name, ops in FORMS.items():
        got = [x.tolist() for x in ops(logits, tokens, a.k)]
        assert got[1] == ref[1], name
        assert all(abs(u - v) < 1e-4 for r, g in zip(ref[2], got[2]) for u, v in zip(r, g)), name
    out = {f"{name} rows={m}": measure(ops, m, a.vocab, a.k, a.steps)
           for m in (int(r) for r in a.rows.split(",")) for name, ops in FORMS.items()}
    print(json.dumps({"device": str(mx.default_device()), "vocab": a.vocab, "k": a.k, **out}, indent=1))


if __name__ == "__main__":
    main()
