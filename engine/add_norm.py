"""A residual add and the RMSNorm after it as one CUDA kernel: `s = h + d`, `y = rms_norm(s) * w`.

A decode step of a small model is bound by kernel launches, not by the device: on the H200 one row of the 1B shape
needs ~0.5 ms for its weights and spends ~1.6 ms launching ~230 kernels a token. Every layer adds a block's output
to the residual stream and normalises the sum twice (before attention, before the MLP); MLX launches the add and
the norm as two kernels (its RMSNorm is a primitive that `mx.compile` does not fuse with the add), so this kernel
takes two launches out of every layer. Its arithmetic is MLX's: the sum rounded to the model's dtype, squares summed
in float32, `w * T(s * rsqrt(mean + eps))`. Used on CUDA only and only after a self-test on the device against
MLX's own ops; elsewhere (and for norms other than a plain `nn.RMSNorm`) `add_norm` is the two ops.
"""

from __future__ import annotations

import logging
import os
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn

from engine.accelerator import on_gpu

__all__ = ["available", "add_norm", "fusable", "reference", "THREADS"]

_log = logging.getLogger(__name__)

THREADS = 256  # a block per row: 8 warps, coalesced over the hidden size

_SOURCE = r"""
    const int row = blockIdx.x;
    const int N = h_shape[h_ndim - 1];
    const size_t base = (size_t)row * N;
    float ss = 0.f;
    for (int i = threadIdx.x; i < N; i += NT) {
        const T t = static_cast<T>(static_cast<float>(h[base + i]) + static_cast<float>(d[base + i]));
        s[base + i] = t;
        const float f = static_cast<float>(t);
        ss += f * f;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    __shared__ float part[NT / 32];
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
    __syncthreads();
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < NT / 32; ++w) total += part[w];
    const float inv = rsqrtf(total / N + eps[0]);
    for (int i = threadIdx.x; i < N; i += NT) {
        const T n = static_cast<T>(static_cast<float>(s[base + i]) * inv);
        y[base + i] = static_cast<T>(static_cast<float>(w[i]) * static_cast<float>(n));
    }
"""

_kernel: Any = None
_checked: dict[tuple[Any, int], bool] = {}  # (dtype, hidden size) → passed the self-test
_eps: dict[float, mx.array] = {}


def _enabled() -> bool:
    # TANDEM_ADD_NORM=mlx keeps MLX's two ops (to compare the two on a device).
    if os.environ.get("TANDEM_ADD_NORM", "kernel") == "mlx":
        return False
    return on_gpu() and mx.cuda.is_available()


def _get_kernel() -> Any:
    global _kernel
    if _kernel is None:
        _kernel = mx.fast.cuda_kernel(name="tandem_add_rms_norm", input_names=["h", "d", "w", "eps"],
                                      output_names=["s", "y"], source=_SOURCE)
    return _kernel


def _eps_array(eps: float) -> mx.array:
    arr = _eps.get(eps)
    if arr is None:
        arr = _eps[eps] = mx.array(eps, dtype=mx.float32)
    return arr


def fusable(norm: Any) -> bool:
    """Whether `norm` is a plain `nn.RMSNorm` (weight times the normalised input), the only kind the kernel
    computes. Raises nothing."""
    return type(norm) is nn.RMSNorm


def _kernel_call(h: mx.array, d: mx.array, weight: mx.array, eps: float) -> tuple[mx.array, mx.array]:
    rows = h.size // h.shape[-1]
    s, y = _get_kernel()(inputs=[h, d, weight, _eps_array(eps)], template=[("T", h.dtype), ("NT", THREADS)],
                         grid=(THREADS * rows, 1, 1), threadgroup=(THREADS, 1, 1),
                         output_shapes=[h.shape, h.shape], output_dtypes=[h.dtype, h.dtype])
    return s, y


def add_norm(h: mx.array, d: mx.array, norm: Any, kernel: bool) -> tuple[mx.array, mx.array]:
    """(h + d, norm(h + d)) for a residual stream `h` and a block's output `d` of the same shape; one kernel when
    `kernel` (the caller checked `available` and `fusable(norm)`), else the two ops. Lazy. Raises what MLX
    raises."""
    if kernel:
        return _kernel_call(h, d, norm.weight, norm.eps)
    s = h + d
    return s, norm(s)


def reference(h: mx.array, d: mx.array, weight: mx.array, eps: float) -> tuple[mx.array, mx.array]:
    """What the kernel computes, with MLX's own ops (the self-test's and the tests' yardstick). Lazy."""
    s = h + d
    return s, mx.fast.rms_norm(s, weight, eps)


def _self_test(dtype: Any, hidden: int) -> bool:
    """The kernel against MLX's add and RMSNorm on this device, for a few rows of this hidden size. Raises
    nothing (a compile or launch error disables the kernel)."""
    try:
        kh, kd, kw = mx.random.split(mx.random.key(1), 3)  # own keys: the sampling's random state stays as it was
        h = (mx.random.normal((1, 5, hidden), key=kh) * 4).astype(dtype)
        d = mx.random.normal((1, 5, hidden), key=kd).astype(dtype)
        w = (1 + 0.1 * mx.random.normal((hidden,), key=kw)).astype(dtype)
        got_s, got_y = _kernel_call(h, d, w, 1e-5)
        want_s, want_y = reference(h, d, w, 1e-5)
        err_s = cast(float, mx.abs(got_s.astype(mx.float32) - want_s.astype(mx.float32)).max().item())
        err_y = cast(float, mx.abs(got_y.astype(mx.float32) - want_y.astype(mx.float32)).max().item())
        ok = err_s == 0.0 and err_y <= 2e-2
        _log.info("add+norm kernel (%s, hidden %d): self-test max error sum %.2g, norm %.2g, %s", dtype, hidden,
                  err_s, err_y, "in use" if ok else "NOT used")
        return ok
    except Exception as exc:  # NVRTC or launch failure: MLX's two ops serve instead
        _log.warning("add+norm kernel unavailable (%s): %s", type(exc).__name__, exc)
        return False


def available(dtype: Any, hidden: int) -> bool:
    """Whether the kernel serves this dtype and hidden size here: a CUDA device and a passed self-test (run once
    per shape; it evaluates, so call it outside a compiled function's trace). Raises nothing."""
    if not _enabled() or dtype not in (mx.bfloat16, mx.float16, mx.float32):
        return False
    key = (dtype, hidden)
    if key not in _checked:
        _checked[key] = _self_test(dtype, hidden)
    return _checked[key]
