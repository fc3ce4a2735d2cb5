"""engine/decode_attention.py's kernel on this device: its error against MLX's attention row by row, and its
time against the masked call SlotKV makes without it (slice + bool mask), for decode rows of one layer shape.
CUDA only (the kernel's one backend).

    python -m bench.decode_attention_check [--rows 2,8,32,64] [--context 64,1024,2048] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

import mlx.core as mx

from engine import decode_attention

__all__ = ["main"]


def _case(rows: int, context: int, dtype: Any, heads: int, kv_heads: int, d: int, reps: int) -> dict[str, Any]:
    rng = random.Random(rows * 7919 + context)
    cap = context + 264
    n_slots = rows + rows // 2
    slots = rng.sample(range(n_slots), rows)
    lengths = [max(1, context - rng.randrange(0, max(1, context // 2))) for _ in range(rows)]
    lengths[0] = context
    key = mx.random.key(rows + context)
    kk, kv, kq = mx.random.split(key, 3)
    k = mx.random.normal((n_slots, kv_heads, cap, d), key=kk).astype(dtype)
    v = mx.random.normal((n_slots, kv_heads, cap, d), key=kv).astype(dtype)
    q = mx.random.normal((rows, heads, 1, d), key=kq).astype(dtype)
    scale = 1.0 / d ** 0.5
    s_arr, l_arr = mx.array(slots, dtype=mx.int32), mx.array(lengths, dtype=mx.int32)
    got = decode_attention.attend(q, k, v, s_arr, l_arr, scale)
    want = decode_attention.reference(q, k, v, slots, lengths, scale)
    err = mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item()
    # The masked call SlotKV makes without the kernel: slots 0..span-1, up to the longest row.
    span, length = max(slots) + 1, max(lengths)
    slot_len = [1] * span
    for s, n in zip(slots, lengths):
        slot_len[s] = n
    mask = (mx.arange(length)[None] < mx.array(slot_len)[:, None])[:, None, None, :]
    row_of = [0] * span
    for i, s in enumerate(slots):
        row_of[s] = i
    take, back = mx.array(row_of), mx.array(slots)

    def masked() -> mx.array:
        o = mx.fast.scaled_dot_product_attention(q[take], k[:span, :, :length], v[:span, :, :length],
                                                 scale=scale, mask=mask)
        return o[back]

    def kernel() -> mx.array:
        return decode_attention.attend(q, k, v, s_arr, l_arr, scale)

    out: dict[str, Any] = {"rows": rows, "context": context, "dtype": str(dtype), "max_error": round(float(err), 5)}
    for name, fn in (("masked", masked), ("kernel", kernel)):
        mx.eval(fn())
        t0 = time.perf_counter()
        for _ in range(reps):
            mx.eval([fn() for _ in range(16)])  # 16 layers' worth a graph
        out[f"{name}_us_per_layer"] = round((time.perf_counter() - t0) / (reps * 16) * 1e6, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.decode_attention_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="2,8,32,64")
    p.add_argument("--context", default="64,1024,2048")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    from engine.accelerator import apply_serving_defaults

    apply_serving_defaults()  # the server's MLX settings (no cuDNN attention, no CUDA graphs)
    print(json.dumps({"device": str(mx.default_device()), "cuda": mx.cuda.is_available(),
                      "kernel_available": decode_attention.available(mx.bfloat16, args.head_dim,
                                                                     args.heads // args.kv_heads)}), flush=True)
    results = []
    for dtype in (mx.bfloat16, mx.float32):
        for context in (int(c) for c in args.context.split(",")):
            for rows in (int(r) for r in args.rows.split(",")):
                r = _case(rows, context, dtype, args.heads, args.kv_heads, args.head_dim, args.reps)
                print(json.dumps(r), flush=True)
                results.append(r)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
