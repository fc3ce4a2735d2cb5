"""Whether prompt chunks launched from a second thread (its own MLX stream) leave decode steps alone: decode steps of
`rows` slot rows pipelined on the main thread, timed (a) alone, (b) with a prompt chunk packed into every
`every`-th step (the engine's mixed iterations today), (c) while a second thread runs prompt-only forwards,
one every --gap-ms after the last. Then a prompt prefilled on the second thread is adopted into a slot on the main thread and
decoded there (arrays crossing threads). Figures for deciding how prompts are launched, not a comparison.

    python -m bench.prefill_thread MODEL_DIR [--rows 32] [--chunk 512] [--steps 200] [--every 8]
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

__all__ = ["main"]


def _pcts(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"n": len(xs), "p50_ms": round(1e3 * statistics.median(xs), 3),
            "p90_ms": round(1e3 * xs[int(0.9 * (len(xs) - 1))], 3), "p99_ms": round(1e3 * xs[int(0.99 * (len(xs) - 1))], 3),
            "max_ms": round(1e3 * xs[-1], 3)}


def _prompt(i: int, n: int, vocab: int) -> list[int]:
    return [5 + (i * 131 + j * 7) % (vocab - 10) for j in range(n)]


def _decode(runner: Any, model: Any, slots: list[int], steps: int, vocab: int, chunk: int = 0,
            every: int = 0) -> list[float]:
    """Pipelined decode steps (step N+1 launched before N is read); with `every`, a prompt chunk rides along
    every `every`-th step. Returns each step's wall time (the gap every row saw)."""
    from engine.runner import Segment, make_cache

    pending = mx.argmax(runner.forward([Segment([7], None, True, s) for s in slots]), axis=-1)
    mx.async_eval(pending)
    gaps, last = [], time.perf_counter()
    cache = make_cache(model)
    for i in range(steps):
        segments = [Segment([0], None, True, s, pending) for s in slots]
        if every and i % every == every - 1:
            if cache[0].offset >= 4 * chunk:
                cache = make_cache(model)
            segments.append(Segment(_prompt(i, chunk, vocab), cache, True))
        out = mx.argmax(runner.forward(segments), axis=-1)
        nxt = out[: len(slots)] if len(segments) > len(slots) else out
        mx.async_eval(out, *[a for c in cache for a in (c.keys, c.values)])
        pending.tolist()
        pending = nxt
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    pending.tolist()
    return gaps


class _Prefiller(threading.Thread):
    """Prompt-only forwards back to back on this thread's own stream until stopped; counts tokens."""

    def __init__(self, runner: Any, model: Any, chunk: int, vocab: int, gap: float) -> None:
        super().__init__(daemon=True)
        self.runner, self.model, self.chunk, self.vocab, self.gap = runner, model, chunk, vocab, gap
        self.stop = threading.Event()
        self.tokens = 0
        self.error: BaseException | None = None
        self.times: list[float] = []

    def run(self) -> None:
        from engine.runner import Segment, make_cache

        try:
            i = 0
            cache = make_cache(self.model)
            while i == 0 or not self.stop.is_set():  # one chunk at least, however short the decode run
                if cache[0].offset >= 4 * self.chunk:
                    cache = make_cache(self.model)
                t0 = time.perf_counter()
                logits = self.runner.forward([Segment(_prompt(i, self.chunk, self.vocab), cache, True)])
                mx.eval(mx.argmax(logits, axis=-1), *[a for c in cache for a in (c.keys, c.values)])
                self.times.append(time.perf_counter() - t0)
                self.tokens += self.chunk
                i += 1
                self.stop.wait(self.gap)  # paced like arrivals, not back to back
        except BaseException as exc:  # reported by the main thread
            self.error = exc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.prefill_thread")
    p.add_argument("model")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=8)
    p.add_argument("--gap-ms", type=float, default=40.0, help="the second thread's pause between chunks")
    args = p.parse_args(argv)
    from bench.step_profile import slot_rows
    from engine.runner import Segment, make_cache

    model, vocab, runner, slots = slot_rows(args.model, args.rows, args.context)
    out: dict[str, Any] = {"device": str(mx.default_device()), "rows": args.rows, "chunk": args.chunk}
    _decode(runner, model, slots, 20, vocab, args.chunk, 4)  # warm: kernels compiled, shapes seen
    out["decode_alone"] = _pcts(_decode(runner, model, slots, args.steps, vocab))
    print("alone", out["decode_alone"], flush=True)
    t0 = time.perf_counter()
    gaps = _decode(runner, model, slots, args.steps, vocab, args.chunk, args.every)
    wall = time.perf_counter() - t0
    out["decode_mixed"] = _pcts(gaps)
    out["mixed_prompt_tok_s"] = round(args.chunk * (args.steps // args.every) / wall)
    print("mixed", out["decode_mixed"], out["mixed_prompt_tok_s"], flush=True)
    helper = _Prefiller(runner, model, args.chunk, vocab, args.gap_ms / 1e3)
    helper.start()
    t0 = time.perf_counter()
    try:
        gaps = _decode(runner, model, slots, args.steps, vocab)
    finally:
        helper.stop.set()
        helper.join()
    wall = time.perf_counter() - t0
    out["decode_beside_thread"] = _pcts(gaps)
    out["thread_prompt_tok_s"] = round(helper.tokens / wall)
    out["thread_chunk"] = _pcts(helper.times) if helper.times else None
    out["thread_error"] = repr(helper.error) if helper.error else None
    print("beside thread", out["decode_beside_thread"], out["thread_prompt_tok_s"], out["thread_error"], flush=True)

    # A prompt prefilled on another thread, adopted and decoded here.
    box: dict[str, Any] = {}

    def prefill() -> None:
        try:
            cache = make_cache(model)
            logits = runner.forward([Segment(_prompt(99, 300, vocab), cache, True)])
            box["token"] = mx.argmax(logits, axis=-1)
            mx.eval(box["token"], *[a for c in cache for a in (c.keys, c.values)])
            box["cache"] = cache
        except BaseException as exc:
            box["error"] = exc

    th = threading.Thread(target=prefill)
    th.start()
    th.join()
    try:
        if "error" in box:
            raise box["error"]
        slot = runner.slots.adopt(box["cache"])
        logits = runner.forward([Segment([int(box["token"].item())], None, True, s) for s in [*slots, slot]])
        out["cross_thread_adopt"] = f"ok, {int(mx.argmax(logits, axis=-1).shape[0])} rows decoded"
    except BaseException as exc:
        out["cross_thread_adopt"] = f"failed: {type(exc).__name__}: {exc}"
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
