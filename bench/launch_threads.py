"""What MLX's kernel launches cost the host, from one thread and from two at once: each thread builds a chain of
`ops` small elementwise ops on its own stream and launches it (`mx.async_eval`), `rounds` times; the launch's time
per op is reported for one thread alone, for two threads launching together, and for one thread beside another
that only runs Python. Figures for deciding whether prompt chunks should be launched from the decode thread (the
prefill lane's chunk took 12-13 ms to launch beside decode steps on the H200, 5-8 ms alone), not a comparison.

    python -m bench.launch_threads [--ops 400] [--rounds 20] [--size 4096]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Any

from engine.backend import ensure_fast_blas

ensure_fast_blas()  # a script entry point: the fast BLAS must be loaded before mlx is imported below

import mlx.core as mx

__all__ = ["launch_us_per_op", "main"]


def launch_us_per_op(ops: int, rounds: int, size: int, start: threading.Barrier | None = None) -> list[float]:
    """Per round: microseconds per op of launching a chain of `ops` elementwise ops (after it was built), each
    round waited for before the next. `start`: a barrier to pass before the first round. Raises nothing."""
    x = mx.ones((size,))
    mx.eval(x)
    out: list[float] = []
    if start is not None:
        start.wait()
    for _ in range(rounds):
        y = x
        for _ in range(ops):
            y = y * 1.0001 + 1.0
        t0 = time.perf_counter()
        mx.async_eval(y)
        out.append((time.perf_counter() - t0) * 1e6 / (2 * ops))
        mx.eval(y)
    return out


def _python_only(stop: threading.Event) -> None:
    """Pure Python work holding the GIL in turns, until `stop`."""
    while not stop.is_set():
        sum(i * i for i in range(2000))


def _together(ops: int, rounds: int, size: int, other: str) -> dict[str, Any]:
    """Launches on this thread while another thread launches too (`other` "launch") or runs Python ("python")."""
    box: dict[str, list[float]] = {}
    stop = threading.Event()
    barrier = threading.Barrier(2)

    def second() -> None:
        if other == "launch":
            box["other"] = launch_us_per_op(ops, rounds, size, barrier)
        else:
            barrier.wait()
            _python_only(stop)

    t = threading.Thread(target=second)
    t.start()
    mine = launch_us_per_op(ops, rounds, size, barrier)
    stop.set()
    t.join()
    return {"this": _summary(mine), **({"other": _summary(box["other"])} if "other" in box else {})}


def _summary(us: list[float]) -> dict[str, float]:
    return {"p50_us_per_op": round(statistics.median(us), 3), "max_us_per_op": round(max(us), 3)}


def main(argv: list[str] | None = None) -> int:
    """Print one JSON line of the three cases. Raises SystemExit on bad options."""
    p = argparse.ArgumentParser(prog="python -m bench.launch_threads", description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=400, help="elementwise ops a chain (two kernels each: * and +)")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--size", type=int, default=4096, help="elements per array (small: the launch is the cost)")
    a = p.parse_args(argv)
    from engine.accelerator import apply_serving_defaults

    apply_serving_defaults()  # the server's MLX settings (no CUDA graphs)
    launch_us_per_op(a.ops, 3, a.size)  # compile the kernels once, outside the figures
    result = {"device": str(mx.default_device()), "ops": 2 * a.ops,
              "alone": _summary(launch_us_per_op(a.ops, a.rounds, a.size)),
              "two_launching": _together(a.ops, a.rounds, a.size, "launch"),
              "beside_python": _together(a.ops, a.rounds, a.size, "python")}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
