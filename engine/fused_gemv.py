"""Matrix-vector products for a few decode rows with the ops around them folded in: one CUDA kernel each.

A decode step of a small model launches ~13 kernels a llama layer, each ~5-7 µs of host time on the H200 (~20 µs
for cuBLASLt's products past one row) and a few µs of device time even when it moves little (bench/RESULTS.md).
Five of them are norms, residual adds and the SwiGLU product that only feed or follow a matrix-vector product;
these kernels do them inside it. `norm_project`: rms_norm(x) @ W.T — the norm's scale factors out of each dot product, so every warp sums x's
squares as it reads x for its own row, no second pass. `norm_swiglu`: silu(n @ Wg.T) * (n @ Wu.T) from the fused
gate/up weight. `project_add`: h + x @ W.T. Each warp a few output rows, 16-byte loads, float32 sums. Used on CUDA
only (by default for models up to 2,048 wide; TANDEM_FUSED_GEMV=off | on), after a self-test against MLX's ops.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, cast

import mlx.core as mx

from engine.accelerator import on_gpu
from engine.device_scalars import float32_scalar

__all__ = ["AUTO_MAX_HIDDEN", "MAX_ROWS", "available", "enabled", "layout", "norm_project", "norm_swiglu",
           "project_add", "reference", "suits"]

_log = logging.getLogger(__name__)

MAX_ROWS = 4  # decode rows these kernels serve (each row's sums are registers of every lane)
# Unasked, models up to this hidden width only: measured faster there (the 1B shape). A wider model's decode step waits
# on the device more than on launches, and there the kernels' slower reads may cost more than the launches they save.
AUTO_MAX_HIDDEN = 2048
WARPS = 8  # warps a block

_HEADER = r"""
// 16 bytes of a 2-byte float type as 8 floats.
template <typename T>
__device__ inline void fg_unpack8(const uint4& r, float* f) {
    const T* e = reinterpret_cast<const T*>(&r);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = static_cast<float>(e[i]);
}

__device__ inline float fg_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
"""

# A warp takes NR consecutive output rows (with SWIGLU, NR gate rows and the NR up rows that go with them) over a
# part of K (SPLIT warps a row group, each a contiguous part); lane l reads elements [l*8, l*8+8) of every 256 in
# its part. Each step loads one 16-byte piece of every row's weights, then x's piece for each input row once for all
# NR rows (x and the norm's weight are small and stay in L1; reading them once per output row made the kernel 2x
# slower than MLX's plain gemv). The parts' sums meet in shared memory.
# NORM: out = (x * rsqrt(mean(x²) + eps) * g) @ w.T, the scale applied to each dot product; with SWIGLU w is gate
# and up stacked (2N, K) and out = silu(gate) * up. ADD: out = h + x @ w.T (the product rounded before the add, as
# MLX's two ops give it).
_BODY = r"""
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    // K and N from w's shape, not template arguments: every width of a model shares one compile (NVRTC, ~2.3 s a
    // kernel in every process on the H100: MLX keeps custom kernels out of its disk cache).
    const int K = w_shape[1];
    const int N = SWIGLU ? w_shape[0] / 2 : w_shape[0];
    constexpr int GROUPS = NW / SPLIT;
    const int n0 = (blockIdx.x * GROUPS + warp / SPLIT) * NR;
    const int part = warp % SPLIT;
    constexpr int ROWS = SWIGLU ? 2 : 1;
    const int ITERS = K / 256 / SPLIT;
    float acc[ROWS][NR][R], ss[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        ss[r] = 0.f;
#pragma unroll
        for (int j = 0; j < ROWS; ++j) {
#pragma unroll
            for (int m = 0; m < NR; ++m) acc[j][m][r] = 0.f;
        }
    }
    const size_t k0 = (size_t)part * (K / SPLIT) + lane * 8;
#pragma unroll 2
    for (int it = 0; it < ITERS; ++it) {
        const size_t k = k0 + (size_t)it * 256;
        uint4 wv[ROWS][NR];
#pragma unroll
        for (int j = 0; j < ROWS; ++j) {
#pragma unroll
            for (int m = 0; m < NR; ++m) {
                const int n = n0 + m;
                wv[j][m] = n < N ? *reinterpret_cast<const uint4*>(w + (size_t)(n + j * N) * K + k)
                                 : make_uint4(0u, 0u, 0u, 0u);
            }
        }
        PROLOGUE
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float xf[8];
            fg_unpack8<T>(*reinterpret_cast<const uint4*>(x + (size_t)r * K + k), xf);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                SCALE_INPUT
            }
#pragma unroll
            for (int j = 0; j < ROWS; ++j) {
#pragma unroll
                for (int m = 0; m < NR; ++m) {
                    float wf[8];
                    fg_unpack8<T>(wv[j][m], wf);
#pragma unroll
                    for (int i = 0; i < 8; ++i) acc[j][m][r] += wf[i] * xf[i];
                }
            }
        }
    }
    // Butterfly sums: every lane ends with every total.
#pragma unroll
    for (int r = 0; r < R; ++r) {
        ss[r] = fg_warp_sum(ss[r]);
#pragma unroll
        for (int j = 0; j < ROWS; ++j) {
#pragma unroll
            for (int m = 0; m < NR; ++m) acc[j][m][r] = fg_warp_sum(acc[j][m][r]);
        }
    }
    if constexpr (SPLIT > 1) {
        __shared__ float parts[NW][ROWS * NR + 1][R];
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                parts[warp][ROWS * NR][r] = ss[r];
#pragma unroll
                for (int j = 0; j < ROWS; ++j) {
#pragma unroll
                    for (int m = 0; m < NR; ++m) parts[warp][j * NR + m][r] = acc[j][m][r];
                }
            }
        }
        __syncthreads();
        if (part != 0) return;
#pragma unroll
        for (int p = 1; p < SPLIT; ++p) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                ss[r] += parts[warp + p][ROWS * NR][r];
#pragma unroll
                for (int j = 0; j < ROWS; ++j) {
#pragma unroll
                    for (int m = 0; m < NR; ++m) acc[j][m][r] += parts[warp + p][j * NR + m][r];
                }
            }
        }
    }
    // Lane m * R + r writes output row n0 + m of input row r.
#pragma unroll
    for (int m = 0; m < NR; ++m) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int n = n0 + m;
            if (lane == (m * R + r) % 32 && n < N) {
                EPILOGUE
                out[(size_t)r * N + n] = static_cast<T>(a);
            }
        }
    }
"""

_NORM_PIECES = {
    "PROLOGUE": "float gf[8];\n        fg_unpack8<T>(*reinterpret_cast<const uint4*>(g + k), gf);",
    "SCALE_INPUT": "ss[r] += xf[i] * xf[i];\n                xf[i] *= gf[i];",
    "EPILOGUE": r"""const float scale = rsqrtf(ss[r] / K + eps[0]);
                float a = acc[0][m][r] * scale;
                if constexpr (SWIGLU) {
                    // mlx-lm's swiglu in the weights' dtype: silu(gate) rounded, times up.
                    const float gate = static_cast<float>(static_cast<T>(a));
                    const float up = static_cast<float>(static_cast<T>(acc[ROWS - 1][m][r] * scale));
                    a = static_cast<float>(static_cast<T>(gate / (1.f + __expf(-gate)))) * up;
                }""",
}
_ADD_PIECES = {
    "PROLOGUE": "",
    "SCALE_INPUT": "",
    "EPILOGUE": "const float a = static_cast<float>(static_cast<T>(acc[0][m][r]))"
                " + static_cast<float>(h[(size_t)r * N + n]);",
}


def _source(pieces: dict[str, str]) -> str:
    body = _BODY
    for name, text in pieces.items():
        body = body.replace(name, text)
    return body


_kernels: dict[str, Any] = {}
_checked: dict[tuple[Any, int, int, int], bool] = {}  # (dtype, hidden, intermediate, rows) → passed the self-test


def enabled() -> bool:
    """Whether the kernels may serve here: a CUDA device, unless TANDEM_FUSED_GEMV=off. Raises nothing."""
    # Each kernel reads its weights 10-40 % slower than MLX's gemv, but saves launches: over HTTP on the H200 c1
    # +14-30 %, c8 +12-20 %, poisson8's ITL p99 -19-32 %, c64 +4-7 %, nothing slower (bench/RESULTS.md, 32nd session).
    if _choice() == "off":
        return False
    return on_gpu() and mx.cuda.is_available()


def suits(hidden: int) -> bool:
    """Whether a model `hidden` wide gets the kernels: up to AUTO_MAX_HIDDEN unless TANDEM_FUSED_GEMV=on asks for them
    at any width (`enabled` says whether they may serve at all). Raises nothing."""
    return hidden <= AUTO_MAX_HIDDEN or _choice() == "on"


def _choice() -> str:
    return os.environ.get("TANDEM_FUSED_GEMV", "auto").lower()


def _kernel(name: str) -> Any:
    k = _kernels.get(name)
    if k is None:
        if name == "add":
            k = mx.fast.cuda_kernel(name="tandem_project_add", input_names=["x", "w", "h"], output_names=["out"],
                                    source=_source(_ADD_PIECES), header=_HEADER)
        else:
            k = mx.fast.cuda_kernel(name="tandem_norm_project", input_names=["x", "g", "w", "eps"],
                                    output_names=["out"], source=_source(_NORM_PIECES), header=_HEADER)
        _kernels[name] = k
    return k


def layout(k: int, n: int, split: int | None = None, nr: int | None = None) -> tuple[int, int]:
    """(split, nr) for N = `n` products over K = `k`: warps a row group (`split`, K cut in that many parts) and output
    rows a warp (`nr`, each reads x once for all of them). Defaults from a sweep of every pair on the H200 at one row
    (bench/RESULTS.md, twenty-ninth session): one part, 4 rows a warp from 3,072 rows, else 2. Given ones are kept
    where they fit. Raises nothing."""
    if nr is None or nr not in (1, 2, 4, 8):
        nr = 4 if n >= 3072 else 2
    if split is None or split < 1 or (k // 256) % split or WARPS % split:
        split = 1
    return split, nr


def _launch(name: str, inputs: list[mx.array], rows: int, k: int, n: int, swiglu: bool, split: int | None,
            nr: int | None, out_shape: tuple[int, ...], dtype: Any) -> mx.array:
    sp, r = layout(k, n, split, nr)
    blocks = -(-(-(-n // r)) // (WARPS // sp))
    return _kernel(name)(inputs=inputs,
                         template=[("T", dtype), ("R", rows), ("NW", WARPS), ("SPLIT", sp), ("NR", r),
                                   ("SWIGLU", swiglu)],
                         grid=(blocks * WARPS * 32, 1, 1), threadgroup=(WARPS * 32, 1, 1),
                         output_shapes=[out_shape], output_dtypes=[dtype])[0]


def norm_project(x: mx.array, g: mx.array, eps: float, w: mx.array, split: int | None = None,
                 nr: int | None = None) -> mx.array:
    """rms_norm(x, g, eps) @ w.T for x (rows, K), w (N, K) → (rows, N). `split`, `nr`: see `layout`. Lazy.
    Raises nothing of its own."""
    rows, k = x.shape
    n = w.shape[0]
    return _launch("norm", [x, g, w, float32_scalar(eps)], rows, k, n, False, split, nr, (rows, n), x.dtype)


def norm_swiglu(x: mx.array, g: mx.array, eps: float, w: mx.array, split: int | None = None,
                nr: int | None = None) -> mx.array:
    """silu(n @ gate.T) * (n @ up.T) with n = rms_norm(x, g, eps) and w = gate and up stacked (2N, K) → (rows, N).
    Lazy. Raises nothing of its own."""
    rows, k = x.shape
    n = w.shape[0] // 2
    return _launch("norm", [x, g, w, float32_scalar(eps)], rows, k, n, True, split, nr, (rows, n), x.dtype)


def project_add(x: mx.array, w: mx.array, h: mx.array, split: int | None = None,
                nr: int | None = None) -> mx.array:
    """h + x @ w.T for x (rows, K), w (N, K), h (rows, N). Lazy. Raises nothing of its own."""
    rows, k = x.shape
    return _launch("add", [x, w, h], rows, k, w.shape[0], False, split, nr, h.shape, h.dtype)


def reference(x: mx.array, g: mx.array, eps: float, w_qkv: mx.array, w_gate_up: mx.array, w_down: mx.array,
              h: mx.array) -> list[mx.array]:
    """What the three kernels compute, with MLX's ops: [norm_project, norm_swiglu, project_add(x's norm, ...)].
    Lazy. Raises nothing of its own."""
    from mlx_lm.models.activations import swiglu

    n = mx.fast.rms_norm(x, g, eps)
    gate, up = mx.split(n @ w_gate_up.T, 2, axis=-1)
    a = swiglu(gate, up)
    return [n @ w_qkv.T, a, h + a @ w_down.T]


def _self_test(dtype: Any, hidden: int, intermediate: int, rows: int) -> bool:
    """The kernels against MLX's ops on this device at this model's widths. Raises nothing (a compile or launch
    error disables them)."""
    t0 = time.perf_counter()
    try:
        keys = mx.random.split(mx.random.key(1), 6)  # own keys: the sampling's random state stays as it was
        x = (mx.random.normal((rows, hidden), key=keys[0]) * 3).astype(dtype)
        g = (1 + 0.1 * mx.random.normal((hidden,), key=keys[1])).astype(dtype)
        s = hidden ** -0.5
        # Output rows as a model's q/k/v stack has them (4 a warp: the serving compile), the last warp's part-filled.
        w_qkv = (mx.random.normal((3 * 1024 + 6, hidden), key=keys[2]) * s).astype(dtype)
        w_gu = (mx.random.normal((2 * intermediate, hidden), key=keys[3]) * s).astype(dtype)
        w_down = (mx.random.normal((hidden, intermediate), key=keys[4]) * intermediate ** -0.5).astype(dtype)
        h = mx.random.normal((rows, hidden), key=keys[5]).astype(dtype)
        want = reference(x, g, 1e-5, w_qkv, w_gu, w_down, h)
        a = norm_swiglu(x, g, 1e-5, w_gu)
        got = [norm_project(x, g, 1e-5, w_qkv), a, project_add(a, w_down, h)]
        err = max(cast(float, (mx.abs(u.astype(mx.float32) - v.astype(mx.float32)).max()
                               / (mx.abs(v.astype(mx.float32)).max() + 1e-6)).item()) for u, v in zip(got, want))
        ok = err <= 2e-2
        _log.info("fused matrix-vector kernels (%s, %d/%d wide, %d rows): self-test max relative error %.2g, %s "
                  "(%.1f s)", dtype, hidden, intermediate, rows, err, "in use" if ok else "NOT used",
                  time.perf_counter() - t0)
        return ok
    except Exception as exc:  # NVRTC or launch failure: MLX's ops serve instead
        _log.warning("fused matrix-vector kernels unavailable (%s): %s", type(exc).__name__, exc)
        return False


def available(dtype: Any, hidden: int, intermediate: int, rows: int) -> bool:
    """Whether the kernels serve a step of `rows` rows here: a CUDA device, a 2-byte float dtype, widths that are
    multiples of 256 (whole 16-byte loads a lane), at most MAX_ROWS rows, and a passed self-test (once per shape;
    evaluates on the calling thread, the engine thread). Raises nothing."""
    if not enabled() or not 1 <= rows <= MAX_ROWS or hidden % 256 or intermediate % 256 \
            or dtype not in (mx.bfloat16, mx.float16):
        return False
    key = (dtype, hidden, intermediate, rows)
    if key not in _checked:
        _checked[key] = _self_test(dtype, hidden, intermediate, rows)
    return _checked[key]
