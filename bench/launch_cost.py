"""What one kernel launch costs on a device, by kind: chains of launches that cannot fuse (each op's output feeds the
next), inside one `mx.compile`d function and built op by op, timed per launch. Kinds: MLX's RMSNorm primitive, MLX's
RoPE primitive, matrix products by row count, and an `mx.fast.cuda_kernel` that does a norm's memory traffic (on CUDA only). A decode step of a
small model is bound by launches (bench/RESULTS.md, twenty-second session: a custom add+norm kernel that took two
launches out of every layer made the step slower); this says whether a custom kernel's launch costs more than a
built-in one's. Prints one JSON line per kind and mode: host µs a launch (`mx.async_eval` returning) and wall µs a
launch (through the device), medians over the steps.

    python -m bench.launch_cost [--launches 64] [--steps 100] [--size 2048]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

from engine.backend import ensure_fast_blas

ensure_fast_blas()  # a script entry point: the fast BLAS must be loaded before mlx is imported below

import mlx.core as mx

__all__ = ["main", "chains", "host_and_wall"]

_COPY = r"""
    const int row = blockIdx.x;
    const int N = x_shape[x_ndim - 1];
    for (int i = threadIdx.x; i < N; i += 256) {
        out[(size_t)row * N + i] = static_cast<T>(static_cast<float>(x[(size_t)row * N + i]) * static_cast<float>(w[i]));
    }
"""


def chains(size: int, launches: int, matmul_rows: tuple[int, ...] = ()) -> dict[str, Callable[[mx.array], mx.array]]:
    """The chains by kind, each `launches` long over a (1, 1, size) activation; `matmul_rows`: a chain of (rows,
    size) @ (size, size) products for each row count (cuBLASLt past one row on CUDA). Raises nothing."""
    w = mx.ones((size,), mx.bfloat16)
    out: dict[str, Callable[[mx.array], mx.array]] = {}

    def norms(x: mx.array) -> mx.array:
        for _ in range(launches):
            x = mx.fast.rms_norm(x, w, 1e-5)
        return x

    offset = mx.array([5], mx.int32)

    def ropes(x: mx.array) -> mx.array:
        x = x.reshape(1, size // 64, 1, 64)
        for _ in range(launches):
            x = mx.fast.rope(x, 64, traditional=False, base=10000.0, scale=1.0, offset=offset)
        return x.reshape(1, 1, size)

    out["rms_norm"], out["rope"] = norms, ropes
    weight = (mx.random.normal((size, size)) * size ** -0.5).astype(mx.bfloat16)
    for rows in matmul_rows:
        def matmuls(x: mx.array, rows: int = rows) -> mx.array:
            x = mx.broadcast_to(x.reshape(1, size), (rows, size)) + 0  # a row count MLX's gemv does not take past 1
            for _ in range(launches):
                x = x @ weight.T
            return x[:1].reshape(1, 1, size)

        out[f"matmul_rows{rows}"] = matmuls
    if mx.default_device().type == mx.DeviceType.gpu and mx.cuda.is_available():
        kernel = mx.fast.cuda_kernel(name="bench_scale", input_names=["x", "w"], output_names=["out"], source=_COPY)

        def customs(x: mx.array) -> mx.array:
            for _ in range(launches):
                x = kernel(inputs=[x, w], template=[("T", x.dtype)], grid=(256, 1, 1), threadgroup=(256, 1, 1),
                           output_shapes=[x.shape], output_dtypes=[x.dtype])[0]
            return x

        out["cuda_kernel"] = customs
    return out


def host_and_wall(fn: Callable[[mx.array], Any], x: mx.array, steps: int, per: int) -> tuple[float, float]:
    """Median µs of `fn(x)` over `steps` runs after a warm-up, divided by `per` (the launches or layers it holds):
    on the host (`mx.async_eval` returning) and through the device. Raises what `fn` raises."""
    for _ in range(5):  # traces, JIT compiles, allocator warm
        mx.eval(fn(x))
    host: list[float] = []
    wall: list[float] = []
    for _ in range(steps):
        t0 = time.perf_counter()
        y = fn(x)
        mx.async_eval(y)
        t1 = time.perf_counter()
        mx.eval(y)
        t2 = time.perf_counter()
        host.append((t1 - t0) / per * 1e6)
        wall.append((t2 - t0) / per * 1e6)
    return round(statistics.median(host), 2), round(statistics.median(wall), 2)


def _time(fn: Callable[[mx.array], Any], x: mx.array, steps: int, launches: int) -> dict[str, float]:
    host, wall = host_and_wall(fn, x, steps, launches)
    return {"host_us_per_launch": host, "wall_us_per_launch": wall}


def main(argv: list[str] | None = None) -> int:
    """Prints JSON lines. Raises SystemExit on bad options."""
    ap = argparse.ArgumentParser(prog="python -m bench.launch_cost")
    ap.add_argument("--launches", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--size", type=int, default=2048, help="activation width (a multiple of 64)")
    ap.add_argument("--matmul-rows", default="1,2,8,64,512", help="row counts of the matmul chains ('' for none)")
    a = ap.parse_args(argv)
    x = mx.random.normal((1, 1, a.size)).astype(mx.bfloat16)
    print(json.dumps({"device": str(mx.default_device()), "launches": a.launches, "size": a.size}), flush=True)
    rows = tuple(int(r) for r in a.matmul_rows.split(",") if r)
    for kind, fn in chains(a.size, a.launches, rows).items():
        for mode, f in (("compiled", mx.compile(fn)), ("built", fn)):
            print(json.dumps({"kind": kind, "mode": mode, **_time(f, x, a.steps, a.launches)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
