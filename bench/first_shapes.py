"""What a Whisper encoder unit or decoder forward costs the first time its shapes run vs after (a GPU compiles
kernels per shape): `python -m bench.first_shapes CHECKPOINT [--contexts 1500,500,750,1000] [--positions 375,64,128]`.
Prints one line per (context, positions): the first pass's slowest unit and the same pass again, in ms."""

from __future__ import annotations

import argparse
import time

from engine.backend import ensure_fast_blas

ensure_fast_blas()  # a script entry point: the fast BLAS must be loaded before mlx is imported below

import numpy as np

from audio.decoder import new_row, step_rows
from audio.encoder import EncoderJob, run_unit
from audio.whisper import load_whisper


def _pass(model: object, ctx: int, positions: int, fp16: bool) -> tuple[float, float]:
    """(slowest encoder unit, slowest decoder forward) of one window, in ms."""
    from mlx_whisper.decoding import DecodingOptions

    audio = np.random.default_rng(ctx + positions).normal(0, 0.1, 16000 * 3).astype(np.float32)
    job = EncoderJob(audio, 300, positions, fp16, n_ctx=ctx)
    worst = 0.0
    while not job.done:
        t = time.perf_counter()
        run_unit(model, [job], positions)
        worst = max(worst, time.perf_counter() - t)
    row = new_row(model, DecodingOptions(language="en", fp16=fp16, without_timestamps=True), job.cross_kv or [], [])
    dec = 0.0
    for _ in range(6):
        t = time.perf_counter()
        step_rows(model, [row], None)
        dec = max(dec, time.perf_counter() - t)
    return worst * 1e3, dec * 1e3


def main() -> None:
    p = argparse.ArgumentParser(prog="bench.first_shapes")
    p.add_argument("checkpoint")
    p.add_argument("--contexts", default="1500,500,750,1000")
    p.add_argument("--positions", default="375,64,128")
    p.add_argument("--dtype", default="float16")
    a = p.parse_args()
    loaded = load_whisper(a.checkpoint, a.dtype)
    for ctx in (int(c) for c in a.contexts.split(",")):
        for pos in (int(x) for x in a.positions.split(",")):
            first = _pass(loaded.model, ctx, pos, loaded.fp16)
            again = _pass(loaded.model, ctx, pos, loaded.fp16)
            print(f"ctx {ctx:5d} positions {pos:4d}: encoder unit max {first[0]:7.1f} then {again[0]:7.1f} ms | "
                  f"decoder forward max {first[1]:7.1f} then {again[1]:7.1f} ms", flush=True)


if __name__ == "__main__":
    main()
