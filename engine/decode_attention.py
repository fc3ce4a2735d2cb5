"""Decode attention over the slot buffers with each row's own length: one CUDA kernel a layer.

MLX's fused decode attention on CUDA takes no array mask, so `SlotKV`'s rows of different lengths (a boolean
mask) fall back to matmul, where, softmax and matmul over every slot up to the longest row. On the H200 that
made a decode step of 32 rows 11.6 ms at 2,048 tokens of context against 4.0 ms at 64 (bench/step_profile.py).
This kernel reads each row's own keys and values straight from the slot buffers: no slice, mask or gather.
One thread block per (row, kv head); its warps take the row's keys in turn, D/8 lanes a key, each keeping an
online softmax for every query head of that kv head (a key is loaded once for all of them); the warps' partial
softmaxes are merged in shared memory. Used on CUDA only and only after a self-test on the device against
MLX's own attention; elsewhere (Metal's fused kernel takes the mask; the CPU) the masked call stays.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, cast

import mlx.core as mx

from engine.accelerator import on_gpu
from engine.device_scalars import float32_scalar

__all__ = ["available", "attend", "reference", "WARPS"]

_log = logging.getLogger(__name__)

WARPS = 8  # warps a block: 8 × (32 / (D/8)) keys in flight per step of the loop

_HEADER = r"""
// 8 consecutive elements as floats, in 16-byte loads (rows of the slot buffers are 16-byte aligned).
template <typename T>
__device__ inline void load8(const T* p, float* f) {
    if constexpr (sizeof(T) == 2) {
        const uint4 r = *reinterpret_cast<const uint4*>(p);
        const T* e = reinterpret_cast<const T*>(&r);
#pragma unroll
        for (int i = 0; i < 8; ++i) f[i] = static_cast<float>(e[i]);
    } else {
        const float4 a = *reinterpret_cast<const float4*>(p);
        const float4 b = *reinterpret_cast<const float4*>(p + 4);
        f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
        f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
    }
}
"""

_SOURCE = r"""
    constexpr int LPK = D / 8;            // lanes per key: 8 elements (16 bytes) each
    constexpr int KPW = 32 / LPK;         // keys per warp per step
    const int row = blockIdx.z;
    const int kvh = blockIdx.y;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int grp = lane / LPK;
    const int sub = lane % LPK;
    const int KVH = keys_shape[1];
    const int H = KVH * G;
    const int CAP = keys_shape[2];
    const int slot = slots[row];
    const int L = lens[row];
    const float sc = scale[0];
    const float NEG_INF = __int_as_float(0xff800000);

    float qv[G][8];
    float m[G], s[G], acc[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const T* qp = q + (size_t)row * q_strides[0] + ((size_t)kvh * G + g) * q_strides[1] + sub * 8;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            qv[g][i] = static_cast<float>(qp[i]) * sc;
            acc[g][i] = 0.f;
        }
        m[g] = NEG_INF;
        s[g] = 0.f;
    }
    const size_t base = ((size_t)slot * KVH + kvh) * (size_t)CAP * D + sub * 8;
    for (int j0 = warp * KPW; j0 < L; j0 += NW * KPW) {
        const int j = j0 + grp;
        const bool valid = j < L;
        float kf[8], vf[8];
        if (valid) {
            load8(keys + base + (size_t)j * D, kf);
            load8(values + base + (size_t)j * D, vf);
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                kf[i] = 0.f;
                vf[i] = 0.f;
            }
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float dot = 0.f;
#pragma unroll
            for (int i = 0; i < 8; ++i) dot += qv[g][i] * kf[i];
#pragma unroll
            for (int o = LPK / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
            if (valid) {
                const float mn = fmaxf(m[g], dot);
                const float c = __expf(m[g] - mn);
                const float p = __expf(dot - mn);
                s[g] = s[g] * c + p;
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[g][i] = acc[g][i] * c + p * vf[i];
                m[g] = mn;
            }
        }
    }
    // Merge the warp's key groups (lanes that differ in the bits above LPK).
#pragma unroll
    for (int o = LPK; o < 32; o <<= 1) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
            const float om = __shfl_xor_sync(0xffffffffu, m[g], o);
            const float os = __shfl_xor_sync(0xffffffffu, s[g], o);
            const float M = fmaxf(m[g], om);
            const float c1 = m[g] == NEG_INF ? 0.f : __expf(m[g] - M);
            const float c2 = om == NEG_INF ? 0.f : __expf(om - M);
            s[g] = s[g] * c1 + os * c2;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float oa = __shfl_xor_sync(0xffffffffu, acc[g][i], o);
                acc[g][i] = acc[g][i] * c1 + oa * c2;
            }
            m[g] = M;
        }
    }
    __shared__ float sm_m[NW][G];
    __shared__ float sm_s[NW][G];
    __shared__ float sm_acc[NW][G][D];
    if (grp == 0) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
            if (sub == 0) {
                sm_m[warp][g] = m[g];
                sm_s[warp][g] = s[g];
            }
#pragma unroll
            for (int i = 0; i < 8; ++i) sm_acc[warp][g][sub * 8 + i] = acc[g][i];
        }
    }
    __syncthreads();
    for (int t = threadIdx.x; t < G * D; t += NW * 32) {
        const int g = t / D;
        const int d = t % D;
        float M = NEG_INF;
        for (int w = 0; w < NW; ++w) M = fmaxf(M, sm_m[w][g]);
        float S = 0.f, O = 0.f;
        for (int w = 0; w < NW; ++w) {
            const float mw = sm_m[w][g];
            if (mw != NEG_INF) {
                const float c = __expf(mw - M);
                S += sm_s[w][g] * c;
                O += sm_acc[w][g][d] * c;
            }
        }
        out[((size_t)row * H + (size_t)kvh * G + g) * D + d] = static_cast<T>(S > 0.f ? O / S : 0.f);
    }
"""

_kernel: Any = None
_checked: dict[tuple[Any, int, int], bool] = {}  # (dtype, head_dim, heads per kv head) → passed the self-test


def _enabled() -> bool:
    # TANDEM_DECODE_ATTENTION=mlx keeps MLX's masked call (to compare the two on a device).
    if os.environ.get("TANDEM_DECODE_ATTENTION", "kernel") == "mlx":
        return False
    return on_gpu() and mx.cuda.is_available()


def _get_kernel() -> Any:
    global _kernel
    if _kernel is None:
        # Inputs as they are: q may be a strided view (its heads read through q_strides); the slot buffers, the
        # slots and the lengths are always whole contiguous arrays of the engine's own.
        _kernel = mx.fast.cuda_kernel(name="tandem_decode_attention",
                                      input_names=["q", "keys", "values", "slots", "lens", "scale"],
                                      output_names=["out"], source=_SOURCE, header=_HEADER,
                                      ensure_row_contiguous=False)
    return _kernel


def attend(q: mx.array, keys: mx.array, values: mx.array, slots: mx.array, lens: mx.array, scale: float) -> mx.array:
    """q (rows, heads, 1, D; any strides, each head's D elements contiguous, e.g. a view of the q/k/v projection)
    attends to the first lens[r] positions of slot slots[r] in keys/values (slots, kv_heads, capacity, D) → (rows,
    heads, 1, D). Lazy. Raises nothing of its own."""
    rows, heads, _, d = q.shape
    kv_heads = keys.shape[1]
    return _get_kernel()(inputs=[q, keys, values, slots, lens, float32_scalar(scale)],
                         template=[("T", q.dtype), ("D", d), ("G", heads // kv_heads), ("NW", WARPS)],
                         grid=(WARPS * 32, kv_heads, rows), threadgroup=(WARPS * 32, 1, 1),
                         output_shapes=[(rows, heads, 1, d)], output_dtypes=[q.dtype])[0]


def _self_test(dtype: Any, d: int, g: int) -> bool:
    """The kernel against MLX's attention row by row on this device: rows in scattered slots, lengths from 1
    past a warp step's reach. Raises nothing (a compile or launch error disables the kernel)."""
    kv_heads, cap, lengths, slots = 2, 600, [1, 37, 300, 513], [3, 0, 5, 1]
    t0 = time.perf_counter()
    try:
        kk, kv, kq = mx.random.split(mx.random.key(0), 3)  # own keys: the sampling's random state stays as it was
        k = mx.random.normal((6, kv_heads, cap, d), key=kk).astype(dtype)
        v = mx.random.normal((6, kv_heads, cap, d), key=kv).astype(dtype)
        heads = kv_heads * g
        # q as the steps pass it: a strided view of a projection that holds k's and v's heads too.
        qkv = mx.random.normal((len(slots), heads + 2 * kv_heads, 1, d), key=kq).astype(dtype)
        q = qkv[:, :heads]
        scale = 1.0 / float(d) ** 0.5
        at, lens = mx.array(slots, dtype=mx.int32), mx.array(lengths, dtype=mx.int32)
        want = reference(mx.contiguous(q), k, v, slots, lengths, scale)
        err = max(cast(float, mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item())
                  for got in (attend(q, k, v, at, lens, scale), attend(mx.contiguous(q), k, v, at, lens, scale)))
        ok = err <= 2e-2
        _log.info("decode attention kernel (%s, head_dim %d, %d heads a kv head): self-test max error %.2g, %s "
                  "(%.1f s)", dtype, d, g, err, "in use" if ok else "NOT used", time.perf_counter() - t0)
        return ok
    except Exception as exc:  # NVRTC or launch failure: MLX's masked call serves instead
        _log.warning("decode attention kernel unavailable (%s): %s", type(exc).__name__, exc)
        return False


def available(dtype: Any, head_dim: int, heads_per_kv: int) -> bool:
    """Whether `attend` serves this shape here: a CUDA device, head_dim a multiple of 8 dividing 256 (8 elements
    a lane, whole keys per warp), and a passed self-test (run once per shape; evaluates on the calling thread,
    the engine thread). Raises nothing."""
    if not _enabled() or head_dim % 8 or 256 % head_dim or dtype not in (mx.bfloat16, mx.float16, mx.float32):
        return False
    key = (dtype, head_dim, heads_per_kv)
    if key not in _checked:
        _checked[key] = _self_test(dtype, head_dim, heads_per_kv)
    return _checked[key]



def reference(q: mx.array, keys: mx.array, values: mx.array, slots: list[int], lengths: list[int],
              scale: float) -> mx.array:
    """What `attend` computes, with MLX's attention one row at a time (the self-test's and the tests'
    yardstick). Lazy. Raises nothing of its own."""
    return mx.concatenate([mx.fast.scaled_dot_product_attention(
        q[i : i + 1], keys[s : s + 1, :, :n], values[s : s + 1, :, :n], scale=scale)
        for i, (s, n) in enumerate(zip(slots, lengths))])
