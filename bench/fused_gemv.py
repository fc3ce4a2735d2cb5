"""The fused matrix-vector kernels (engine/fused_gemv.py) against MLX's own ops, at a model's widths: their error, and
a llama layer's four folded stages chained over `--layers` layers of their own weights, host µs (`mx.async_eval`
returning) and wall µs (through the device) a layer, each way compiled as the decode step runs them. Prints JSON
lines. CUDA only.

    python -m bench.fused_gemv [--hidden 2048] [--intermediate 8192] [--qkv 3072] [--rows 1,2,4] [--layers 16]

`--per-kernel`: each product of a layer (and the output projection, `--vocab` wide) alone, MLX's matmul against the
kernel at its default layout (`--sweep`: every split and rows a warp; engine/fused_gemv.layout), `--reps` launches over weights too many to stay in L2: µs a
launch and the weights' GB/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any, Callable, cast

import mlx.core as mx
from mlx_lm.models.activations import swiglu

from bench.launch_cost import host_and_wall
from engine import fused_gemv

__all__ = ["main"]


def _chains(layers: list[dict[str, mx.array]], eps: float) -> dict[str, Callable[[mx.array], mx.array]]:
    def mlx_ops(h: mx.array) -> mx.array:
        for w in layers:
            y = mx.fast.rms_norm(h, w["g1"], eps) @ w["qkv"].T
            h = h + mx.contiguous(y[:, : h.shape[1]]) @ w["o"].T  # the attention output stands in: q of the projection
            gate, up = mx.split(mx.fast.rms_norm(h, w["g2"], eps) @ w["gate_up"].T, 2, axis=-1)
            h = h + swiglu(gate, up) @ w["down"].T
        return h

    def folded(h: mx.array) -> mx.array:
        for w in layers:
            y = fused_gemv.norm_project(h, w["g1"], eps, w["qkv"])
            h = fused_gemv.project_add(mx.contiguous(y[:, : h.shape[1]]), w["o"], h)
            a = fused_gemv.norm_swiglu(h, w["g2"], eps, w["gate_up"])
            h = fused_gemv.project_add(a, w["down"], h)
        return h

    return {"mlx": mlx_ops, "folded": folded}


def _time(fn: Callable[[mx.array], Any], x: mx.array, steps: int, layers: int) -> dict[str, float]:
    host, wall = host_and_wall(fn, x, steps, layers)
    return {"host_us_a_layer": host, "wall_us_a_layer": wall}


def _folded(kind: str, x: mx.array, g: mx.array, h: mx.array, split: int,
            nr: int) -> Callable[[mx.array], mx.array]:
    if kind == "add":
        return lambda w: fused_gemv.project_add(x, w, h, split, nr)
    if kind == "swiglu":
        return lambda w: fused_gemv.norm_swiglu(x, g, 1e-5, w, split, nr)
    return lambda w: fused_gemv.norm_project(x, g, 1e-5, w, split, nr)


def _per_kernel(a: argparse.Namespace, rows: int) -> None:
    dt, H, inter = mx.bfloat16, a.hidden, a.intermediate
    os.environ["TANDEM_FUSED_GEMV"] = "on"  # the kernels are what this measures, whatever the environment says
    shapes = {"qkv": ("norm", a.qkv, H), "o": ("add", H, H), "gate_up": ("swiglu", 2 * inter, H),
              "down": ("add", H, inter), "lm_head": ("norm", a.vocab, H)}
    for name, (kind, n, k) in shapes.items():
        nbytes = n * k * 2
        copies = max(1, -(-(256 << 20) // nbytes))  # 256 MB of weights: a launch finds none of its own in L2
        ws = [(mx.random.normal((n, k)) * k ** -0.5).astype(dt) for _ in range(copies)]
        x = mx.random.normal((rows, k)).astype(dt)
        g = mx.ones((k,), dt)
        h = mx.random.normal((rows, n)).astype(dt)
        mx.eval(ws, x, g, h)

        def mlx_op(w: mx.array) -> mx.array:
            return x @ w.T

        ways: list[tuple[str, Callable[[mx.array], mx.array]]] = [("mlx", mlx_op)]
        default = fused_gemv.layout(k, n // 2 if kind == "swiglu" else n)
        ways.append((f"default_split{default[0]}_nr{default[1]}", _folded(kind, x, g, h, *default)))
        for split in (1, 2, 4) if a.sweep else ():
            for nr in (1, 2, 4, 8):
                if fused_gemv.layout(k, n, split, nr) == (split, nr) != default:
                    ways.append((f"split{split}_nr{nr}", _folded(kind, x, g, h, split, nr)))
        w0 = ws[0]
        if kind == "add":
            want = h + x @ w0.T
        elif kind == "swiglu":
            want = swiglu(*mx.split(mx.fast.rms_norm(x, g, 1e-5) @ w0.T, 2, axis=-1))
        else:
            want = mx.fast.rms_norm(x, g, 1e-5) @ w0.T
        for way, fn in ways:
            for _ in range(3):
                mx.eval([fn(w) for w in ws])
            got = mlx_op(w0) if way == "mlx" else fn(w0)
            err = float(cast(float, (mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max()
                                     / mx.abs(want.astype(mx.float32)).max()).item())) if way != "mlx" else 0.0
            walls, hosts = [], []
            for _ in range(a.steps // 5):
                t0 = time.perf_counter()
                ys = [fn(ws[i % copies]) for i in range(a.reps)]
                mx.async_eval(ys)
                t1 = time.perf_counter()
                mx.eval(ys)
                t2 = time.perf_counter()
                hosts.append((t1 - t0) / a.reps * 1e6)
                walls.append((t2 - t0) / a.reps * 1e6)
            wall = statistics.median(walls)
            print(json.dumps({"rows": rows, "product": name, "way": way, "us_a_launch": round(wall, 2),
                              "host_us": round(statistics.median(hosts), 2),
                              "weights_gb_s": round(nbytes / (wall * 1e-6) / 1e9, 1),
                              "relative_error": round(err, 4)}), flush=True)


def main(argv: list[str] | None = None) -> int:
    """Prints JSON lines. Raises SystemExit on bad options."""
    ap = argparse.ArgumentParser(prog="python -m bench.fused_gemv")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=8192)
    ap.add_argument("--qkv", type=int, default=3072)
    ap.add_argument("--rows", default="1,2,4")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--per-kernel", action="store_true")
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--sweep", action="store_true", help="with --per-kernel: every split and rows-a-warp too")
    a = ap.parse_args(argv)
    dt, H, inter = mx.bfloat16, a.hidden, a.intermediate
    for rows in (int(r) for r in a.rows.split(",")):
        ok = fused_gemv.available(dt, H, inter, rows)
        print(json.dumps({"rows": rows, "self_test_passed": ok}), flush=True)
        if not ok:
            continue
        if a.per_kernel:
            _per_kernel(a, rows)
            continue
        layers = [{"g1": 1 + 0.1 * mx.random.normal((H,)).astype(dt), "g2": 1 + 0.1 * mx.random.normal((H,)).astype(dt),
                   "qkv": (mx.random.normal((a.qkv, H)) * H ** -0.5).astype(dt),
                   "o": (mx.random.normal((H, H)) * H ** -0.5).astype(dt),
                   "gate_up": (mx.random.normal((2 * inter, H)) * H ** -0.5).astype(dt),
                   "down": (mx.random.normal((H, inter)) * inter ** -0.5).astype(dt)} for _ in range(a.layers)]
        mx.eval(layers)
        x = mx.random.normal((rows, H)).astype(dt)
        chains = _chains(layers, 1e-5)
        want, got = mx.compile(chains["mlx"])(x), mx.compile(chains["folded"])(x)
        err = (mx.abs(want.astype(mx.float32) - got.astype(mx.float32)).max() / mx.abs(want.astype(mx.float32)).max())
        weight_bytes = sum(w[k].nbytes for w in layers for k in ("qkv", "o", "gate_up", "down")) / a.layers
        for name, fn in chains.items():
            t = _time(mx.compile(fn), x, a.steps, a.layers)
            print(json.dumps({"rows": rows, "way": name, **t,
                              "weights_gb_s": round(weight_bytes / (t["wall_us_a_layer"] * 1e-6) / 1e9, 1),
                              "relative_error_vs_mlx": round(float(cast(float, err.item())), 5)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
