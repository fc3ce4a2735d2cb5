"""One row's prompt chunk through the packed runner, as the prefill lane runs it, with MLX's attention and with
engine/prefill_attention.py's grouped one, alternating in one process: the host's time to build the graph and to
launch it (`mx.async_eval`, thread CPU and wall), and the whole chunk until evaluated.

    python -m bench.prefill_chunk MODEL_DIR [--chunk 512] [--offsets 0,1536] [--repeats 20] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from engine.backend import ensure_fast_blas

ensure_fast_blas()  # a script entry point: the fast BLAS must be loaded before mlx is imported below

import mlx.core as mx

__all__ = ["main", "measure"]


def measure(model: Any, mode: str, chunk: int, offset: int, repeats: int, vocab: int) -> dict[str, float]:
    """Median ms per chunk (build, launch wall, launch CPU, total) for `chunk` tokens after `offset` in the row's
    cache, attention chosen by `mode` (grouped | sdpa). Raises what MLX raises."""
    from engine.runner import PackedRunner, Segment, make_cache

    os.environ["TANDEM_PREFILL_ATTENTION"] = mode
    runner = PackedRunner(model)
    tokens = [(j * 17) % (vocab - 10) + 5 for j in range(offset + chunk)]
    parts: dict[str, list[float]] = {"build": [], "launch": [], "launch_cpu": [], "total": []}
    for r in range(repeats + 2):
        cache = make_cache(model)
        if offset:
            runner.forward([Segment(tokens[:offset], cache, False)])
            mx.eval([a for c in cache for a in (c.keys, c.values)])
        t0 = time.perf_counter()
        logits = runner.forward([Segment(tokens[offset:], cache, True)])
        t1, c1 = time.perf_counter(), time.thread_time()
        mx.async_eval(logits)
        t2, c2 = time.perf_counter(), time.thread_time()
        mx.eval(logits)
        t3 = time.perf_counter()
        if r >= 2:  # the first two compile
            for k, v in (("build", t1 - t0), ("launch", t2 - t1), ("launch_cpu", c2 - c1), ("total", t3 - t0)):
                parts[k].append(v * 1000)
    return {k: round(statistics.median(v), 3) for k, v in parts.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.prefill_chunk", description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--offsets", default="0,1536")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2, help="alternations of the two modes")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    from engine.accelerator import apply_serving_defaults
    from engine.models import load_model

    apply_serving_defaults()
    model = load_model(args.model).model
    vocab = int(model.args.vocab_size)
    rows = []
    for offset in (int(o) for o in args.offsets.split(",")):
        for rnd in range(args.rounds):
            for mode in ("sdpa", "grouped") if rnd % 2 == 0 else ("grouped", "sdpa"):
                row = {"mode": mode, "offset": offset, "chunk": args.chunk, "round": rnd,
                       **measure(model, mode, args.chunk, offset, args.repeats, vocab)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
