"""The host's cost of launching one forward whose token count is new to the process against one it has seen: MLX
on CUDA prepares a matmul per shape (cuBLASLt), so a packed iteration whose token count (decode rows + prompt
chunk) was never seen pays that again. Figures for deciding whether to bucket token counts, not a comparison.

    python -m bench.shape_launch MODEL_DIR [--tokens 256] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import time

from engine.backend import ensure_fast_blas

ensure_fast_blas()  # a script entry point: the fast BLAS must be loaded before mlx is imported below

import mlx.core as mx

__all__ = ["main"]


def _launch_ms(model: object, counts: list[int]) -> float:
    """Mean host ms of building + async_eval'ing a forward of each token count (each read before the next)."""
    total = 0.0
    for n in counts:
        x = mx.array([[7 + (i % 100) for i in range(n)]])
        t0 = time.perf_counter()
        out = model(x)  # type: ignore[operator]
        mx.async_eval(out)
        total += time.perf_counter() - t0
        mx.eval(out)
    return round(1e3 * total / len(counts), 3)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.shape_launch")
    p.add_argument("model")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args(argv)
    from engine.accelerator import apply_serving_defaults
    from engine.models import load_model

    apply_serving_defaults()
    model = load_model(args.model).model
    n, k = args.tokens, args.steps
    _launch_ms(model, [n] * 3)  # kernels compiled once
    out = {"device": str(mx.default_device()), "tokens": n,
           "same_count_ms": _launch_ms(model, [n] * k),
           "new_count_ms": _launch_ms(model, [n + 1 + i for i in range(k)]),  # each count seen for the first time
           "seen_again_ms": _launch_ms(model, [n + 1 + i for i in range(k)])}  # the same counts a second time
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
