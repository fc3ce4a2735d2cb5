"""What each of our CUDA kernels costs a process the first time it runs (MLX compiles `mx.fast.cuda_kernel` sources
with NVRTC in every process: it keeps them out of its disk cache), against a second run. One line of JSON a kernel.

    python3 -m bench.gpu.kernel_compile [--hidden 2048 --intermediate 8192 --qkv 3072 --head-dim 64 --group 4]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Callable

import mlx.core as mx

from engine import decode_attention, fused_gemv


def _timed(make: Callable[[], mx.array]) -> tuple[float, float]:
    t0 = time.perf_counter()
    mx.eval(make())
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    mx.eval(make())
    return first, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=8192)
    parser.add_argument("--qkv", type=int, default=3072)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--rows", type=int, default=fused_gemv.MAX_ROWS)
    args = parser.parse_args()
    t0 = time.perf_counter()
    mx.eval(mx.ones((4, 4)) @ mx.ones((4, 4)))
    print(json.dumps({"kernel": "first matmul (MLX's own, no JIT)", "first_s": round(time.perf_counter() - t0, 3)}),
          flush=True)
    dt, h, m = mx.bfloat16, args.hidden, args.intermediate
    g = mx.ones((h,), dtype=dt)
    w_qkv = mx.random.normal((args.qkv, h)).astype(dt)
    w_gu = mx.random.normal((2 * m, h)).astype(dt)
    w_o = mx.random.normal((h, h)).astype(dt)
    w_down = mx.random.normal((h, m)).astype(dt)
    mx.eval(g, w_qkv, w_gu, w_o, w_down)
    total = 0.0
    for rows in range(1, args.rows + 1):
        x = mx.random.normal((rows, h)).astype(dt)
        a = mx.random.normal((rows, m)).astype(dt)
        for name, make in (("norm_project qkv", lambda: fused_gemv.norm_project(x, g, 1e-5, w_qkv)),
                           ("norm_swiglu", lambda: fused_gemv.norm_swiglu(x, g, 1e-5, w_gu)),
                           ("project_add o", lambda: fused_gemv.project_add(x, w_o, x)),
                           ("project_add down", lambda: fused_gemv.project_add(a, w_down, x))):
            first, second = _timed(make)
            total += first
            print(json.dumps({"kernel": name, "rows": rows, "first_s": round(first, 3), "second_s": round(second, 4)}),
                  flush=True)
    heads = 8 * args.group
    q = mx.random.normal((4, heads, 1, args.head_dim)).astype(dt)
    kv = mx.random.normal((8, 8, 256, args.head_dim)).astype(dt)
    slots, lens = mx.array([0, 1, 2, 3], dtype=mx.int32), mx.array([5, 40, 100, 256], dtype=mx.int32)
    first, second = _timed(lambda: decode_attention.attend(q, kv, kv, slots, lens, 0.125))
    total += first
    print(json.dumps({"kernel": "decode attention", "first_s": round(first, 3), "second_s": round(second, 4)}))
    t0 = time.perf_counter()
    ok = fused_gemv.available(dt, h, m, 1)
    print(json.dumps({"kernel": "fused GEMV self-test, 1 row", "ok": ok, "first_s": round(time.perf_counter() - t0, 3)}))
    print(json.dumps({"kernel": "total of the first runs above", "first_s": round(total, 2)}))


if __name__ == "__main__":
    main()
