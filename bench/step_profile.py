"""Where one engine iteration's time goes, without HTTP: building the lazy graph on the host (Python + MLX
graph construction), evaluating it (dispatch + device), and the same with one step of lookahead (what
engine/pipeline.py does), for decode-only steps of 1/8/64 rows and mixed steps (64 decode rows + a 128-token
prefill chunk). Figures for deciding what to optimise, not a comparison.

    python -m bench.step_profile MODEL_DIR [--rows 1,8,64] [--context 64,2048] [--steps 30] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from engine.backend import ensure_fast_blas

ensure_fast_blas()  # a script entry point: the fast BLAS must be loaded before mlx is imported below

import mlx.core as mx

__all__ = ["main", "profile"]


def _fill(runner: Any, model: Any, rows: int, length: int, vocab: int) -> list[int]:
    from engine.runner import Segment, make_cache

    slots = []
    for b in range(rows):
        cache = make_cache(model)
        runner.forward([Segment([(b * 131 + j * 17) % (vocab - 10) + 5 for j in range(length)], cache, False)])
        mx.eval([a for c in cache for a in (c.keys, c.values)])
        slots.append(runner.slots.adopt(cache))
    return slots


def slot_rows(model_dir: str, rows: int, context: int) -> tuple[Any, int, Any, list[int]]:
    """(model, vocab, runner, slots): the model loaded with the server's MLX settings and `rows` decode rows of
    `context` tokens in its packed runner's slots. Raises what loading raises."""
    from engine.accelerator import apply_serving_defaults
    from engine.models import load_model
    from engine.runner import PackedRunner

    apply_serving_defaults()
    model = load_model(model_dir).model
    vocab = int(model.args.vocab_size)
    runner = PackedRunner(model)
    return model, vocab, runner, _fill(runner, model, rows, context, vocab)


def _decode_segments(slots: list[int], tokens: list[int]) -> list[Any]:
    from engine.runner import Segment

    return [Segment([t], None, True, s) for t, s in zip(tokens, slots)]


def profile(model: Any, rows: int, steps: int, vocab: int, prefill: int = 0, context: int = 64) -> dict[str, float]:
    """ms per step: build (host graph), eval (after build), total, and total with one step of lookahead;
    each decode row starts with `context` tokens of KV."""
    from engine.runner import PackedRunner, Segment, make_cache

    runner = PackedRunner(model)
    slots = _fill(runner, model, rows, context, vocab)
    tokens = [7] * rows
    build = evaluate = 0.0
    for i in range(steps + 3):
        segments = _decode_segments(slots, tokens)
        if prefill:
            segments.append(Segment([(i * 7 + j) % (vocab - 10) + 5 for j in range(prefill)], make_cache(model), True))
        t0 = time.perf_counter()
        logits = runner.forward(segments)
        picked = mx.argmax(logits, axis=-1)
        t1 = time.perf_counter()
        tokens = picked.tolist()[:rows]
        t2 = time.perf_counter()
        if i >= 3:
            build, evaluate = build + t1 - t0, evaluate + t2 - t1
    out = {"build_ms": 1000 * build / steps, "eval_ms": 1000 * evaluate / steps}
    out["total_ms"] = out["build_ms"] + out["eval_ms"]
    if not prefill:  # lookahead: step N+1 built from step N's lazy tokens before N is read
        pending = mx.argmax(runner.forward(_decode_segments(slots, tokens)), axis=-1)
        mx.async_eval(pending)
        t0 = 0.0
        for i in range(steps + 3):
            if i == 3:
                t0 = time.perf_counter()
            segments = [Segment([0], None, True, s, pending) for s in slots]
            nxt = mx.argmax(runner.forward(segments), axis=-1)
            mx.async_eval(nxt)
            pending.tolist()
            pending = nxt
        out["pipelined_ms"] = 1000 * (time.perf_counter() - t0) / steps
    out["tokens_per_s"] = (rows + prefill) * 1000 / out.get("pipelined_ms", out["total_ms"])
    if runner.compiled is not None:  # engine/compiled_decode.py: shapes traced and the steps that traced them
        out["traces"], out["trace_ms"] = runner.compiled.traces, 1000 * runner.compiled.trace_seconds
    return {k: round(v, 2) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.step_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="an HF-layout model directory")
    p.add_argument("--rows", default="1,8,64", help="decode rows per step, comma-separated (default 1,8,64)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per case (default 30)")
    p.add_argument("--context", default="64", help="KV tokens each decode row holds, comma-separated (default 64)")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    from engine.accelerator import apply_serving_defaults
    from engine.models import load_model

    apply_serving_defaults()  # the server's MLX settings (no cuDNN attention, no CUDA graphs)

    loaded = load_model(args.model)
    vocab = int(loaded.model.args.vocab_size)
    results: dict[str, Any] = {"device": str(mx.default_device())}
    for context in (int(c) for c in args.context.split(",")):
        for rows in (int(r) for r in args.rows.split(",")):
            key = f"decode_{rows}" + (f"@{context}" if context != 64 else "")
            results[key] = profile(loaded.model, rows, args.steps, vocab, context=context)
            print(f"decode {rows:3d} rows, {context} tokens of context: {results[key]}", flush=True)
    rows = max(int(r) for r in args.rows.split(","))
    results[f"mixed_{rows}+128"] = profile(loaded.model, rows, args.steps, vocab, prefill=128)
    print(f"mixed {rows} rows + 128-token chunk: {results[f'mixed_{rows}+128']}", flush=True)
    results["prefill_512"] = profile(loaded.model, 0, max(5, args.steps // 3), vocab, prefill=512)
    print(f"prefill 512 tokens: {results['prefill_512']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
