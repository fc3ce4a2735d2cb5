"""MLX settings a long-running server needs on CUDA, applied before the first model work.

Each is a default only: a variable the user already set is left alone.
"""

from __future__ import annotations

import os

__all__ = ["SERVING_DEFAULTS", "apply_serving_defaults", "on_gpu", "gpu_default", "cpu_default", "compiler_problem"]

SERVING_DEFAULTS = {
    # cuDNN builds an attention graph per exact (query, key) shape, 20-400 ms each: prefill chunks of varied
    # lengths would build one per chunk. MLX's own kernels and the matmul path compile nothing per shape.
    "MLX_CUDA_USE_CUDNN_SDPA": "0",
    # MLX aborts the process once an LRU cache has missed 2x its size over its lifetime; varied traffic
    # reaches that in hours. Misses only cost a rebuild, so keep serving.
    "MLX_ENABLE_CACHE_THRASHING_CHECK": "0",
    # MLX records each command buffer as a CUDA graph keyed by its op sequence. Continuous batching changes
    # that sequence every iteration (rows join and leave, prefill chunks vary), so graphs were instantiated
    # again and again: 63% of the engine thread's eval time under 64 streams on the H200. Launching kernels
    # directly measured 1.9x the tokens/s at 64 streams and 1/20 the Poisson TTFT (bench/RESULTS.md).
    "MLX_USE_CUDA_GRAPHS": "0",
}


def on_gpu() -> bool:
    """Whether MLX computes on a GPU here (its default device; else its CPU backend). Imports MLX. Raises
    nothing."""
    import mlx.core as mx

    return bool(mx.default_device().type == mx.DeviceType.gpu)


def gpu_default(variable: str) -> bool:
    """A switch whose default follows the device: environment `variable` = on | off | auto (unset: auto, which
    is on where MLX computes on a GPU). Raises nothing."""
    choice = os.environ.get(variable, "auto").lower()
    return choice == "on" or (choice != "off" and on_gpu())


def cpu_default(variable: str) -> bool:
    """A switch that is on by default where MLX computes on its CPU backend: `variable` = on | off | auto (unset:
    auto). Raises nothing."""
    choice = os.environ.get(variable, "auto").lower()
    return choice == "on" or (choice != "off" and not on_gpu())


def apply_serving_defaults() -> dict[str, str]:
    """Set each SERVING_DEFAULTS variable that is unset; returns the ones set now. Raises nothing."""
    applied = {}
    for name, value in SERVING_DEFAULTS.items():
        if name not in os.environ:
            os.environ[name] = value
            applied[name] = value
    return applied


def compiler_problem() -> str | None:
    """Why MLX cannot compile kernels here, or None when it can. Its CPU backend builds them in the temporary
    directory: a missing or read-only TMPDIR let a server report ready, then fail every request with a 500. Only
    the CPU backend is tried (a GPU's first kernel build takes seconds). Imports MLX. Raises nothing."""
    import tempfile

    import mlx.core as mx

    if on_gpu():
        return None
    try:
        double = mx.compile(lambda x: mx.exp(x) * 2.0 + 1.0)
        mx.eval(double(mx.ones((3,))))
    except Exception as exc:  # noqa: BLE001 — whatever stops it, the server cannot serve
        where = os.environ.get("TMPDIR") or tempfile.gettempdir()
        return (f"MLX cannot compile its CPU kernels ({exc}); it builds them under the temporary directory "
                f"(TMPDIR={where}): point TMPDIR at a writable directory")
    return None
