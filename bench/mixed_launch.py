"""What a mixed iteration costs the host and the device: decode rows in slots plus one prompt chunk, built, launched
(`mx.async_eval`) and waited for; beside decode-only steps for comparison. Each trial's chunk starts at a new
offset, as a served prompt does, unless --same. Figures for deciding how mixed iterations attend, not a comparison.

    python -m bench.mixed_launch MODEL_DIR [--rows 32] [--chunk 512] [--offsets 0,512,1024,1536] [--trials 12]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from engine.backend import ensure_fast_blas

ensure_fast_blas()  # a script entry point: the fast BLAS must be loaded before mlx is imported below

import mlx.core as mx

__all__ = ["main", "trial"]


def _prompt_cache(model: Any, offset: int) -> list[Any]:
    """A row's cache already holding `offset` positions (zeros: attention cost does not depend on the values)."""
    from engine.runner import make_cache

    cache = make_cache(model)
    if offset:
        inner = model.model.layers[0].self_attn
        d = inner.k_proj.weight.shape[0] // inner.n_kv_heads
        dtype = inner.k_proj.weight.dtype
        for c in cache:
            c.update_and_fetch(mx.zeros((1, inner.n_kv_heads, offset, d), dtype),
                               mx.zeros((1, inner.n_kv_heads, offset, d), dtype))
        mx.eval([a for c in cache for a in (c.keys, c.values)])
    return cache


def trial(runner: Any, model: Any, slots: list[int], chunk: int, offset: int, vocab: int) -> dict[str, float]:
    """One mixed iteration: ms building the graph, launching it, then waiting for the device."""
    from engine.runner import Segment

    cache = _prompt_cache(model, offset)
    segments = [Segment([5 + (s * 13) % (vocab - 10)], None, True, s) for s in slots]
    if chunk:
        segments.append(Segment([5 + (offset + j) % (vocab - 10) for j in range(chunk)], cache, True))
    t0 = time.perf_counter()
    logits = runner.forward(segments)
    t1 = time.perf_counter()
    tokens = mx.argmax(logits, axis=-1)
    mx.async_eval([tokens] + [a for c in cache for a in (c.keys, c.values)])
    t2 = time.perf_counter()
    mx.eval(tokens)
    t3 = time.perf_counter()
    return {"build_ms": 1e3 * (t1 - t0), "launch_ms": 1e3 * (t2 - t1), "wait_ms": 1e3 * (t3 - t2)}


def _summary(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.mixed_launch")
    p.add_argument("model")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--context", type=int, default=256, help="decode rows' context")
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--offsets", default="0,512,1024,1536")
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--modes", default="decode,mixed")
    p.add_argument("--same", action="store_true", help="every trial at the same offset (shapes seen before)")
    args = p.parse_args(argv)
    from bench.step_profile import slot_rows

    model, vocab, runner, slots = slot_rows(args.model, args.rows, args.context)
    out: dict[str, Any] = {"device": str(mx.default_device()), "rows": args.rows, "chunk": args.chunk}
    for mode in args.modes.split(","):
        chunk = 0 if mode == "decode" else args.chunk
        for base in [int(o) for o in args.offsets.split(",")]:
            trial(runner, model, slots, chunk, base, vocab)  # kernels compiled once
            rows = [trial(runner, model, slots, chunk, base + (0 if args.same else 1 + i), vocab)
                    for i in range(args.trials)]
            out[f"{mode}@{base}"] = _summary(rows)
            print(mode, base, out[f"{mode}@{base}"], flush=True)
            if mode == "decode":
                break
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
