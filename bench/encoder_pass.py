"""One Whisper encoder pass on this machine, unit by unit as the scheduler runs it (audio/encoder.py), with
the time per unit kind, against mlx-whisper's one-call `model.encoder`. A micro-benchmark for the CPU path:
every live decode is one full 30 s window through it.

    python -m bench.encoder_pass [--model tiny.en] [--chunk 375] [--repeats 5] [--windows 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import defaultdict
from typing import Any

from engine.backend import ensure_fast_blas

ensure_fast_blas()  # a script entry point: the fast BLAS must be loaded before mlx is imported below

import numpy as np

__all__ = ["main", "one_pass"]


def one_pass(model: Any, chunk: int, windows: int, seed: int) -> tuple[float, dict[str, float]]:
    """Seconds for `windows` windows stacked through every unit, and seconds per unit kind. Raises nothing."""
    from audio.encoder import EncoderJob, run_unit

    rng = np.random.default_rng(seed)
    jobs = [EncoderJob(rng.normal(0, 0.1, 16000 * 8).astype(np.float32), 800, chunk, fp16=False)
            for _ in range(windows)]
    kinds: dict[str, float] = defaultdict(float)
    start = time.perf_counter()
    while not jobs[0].done:
        kind = jobs[0].kind
        t0 = time.perf_counter()
        run_unit(model, jobs)
        kinds[kind] += time.perf_counter() - t0
    return time.perf_counter() - start, dict(kinds)


def main(argv: list[str] | None = None) -> None:
    import mlx.core as mx

    from audio.encoder import mel_window
    from audio.whisper import load_whisper, resolve_whisper_checkpoint

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="Whisper model (default: the demo tiny.en)")
    ap.add_argument("--chunk", type=int, default=375, help="positions per chunked unit (the default budget)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--windows", type=int, default=1, help="windows stacked in each unit")
    args = ap.parse_args(argv)
    loaded = load_whisper(resolve_whisper_checkpoint(args.model))
    model = loaded.model
    one_pass(model, args.chunk, args.windows, seed=0)  # warm-up: allocator, BLAS threads
    runs = [one_pass(model, args.chunk, args.windows, seed=i + 1) for i in range(args.repeats)]
    mel = mel_window(model, np.zeros(16000 * 8, np.float32), 800, loaded.fp16)[None]
    mx.eval(model.encoder(mel))
    calls = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        mx.eval(model.encoder(mel))
        calls.append(time.perf_counter() - t0)
    per_kind = {k: round(statistics.median(r[1].get(k, 0.0) for r in runs) * 1000, 1) for k in runs[0][1]}
    print(json.dumps({
        "model": loaded.name, "dtype": loaded.dtype, "chunk": args.chunk, "windows": args.windows,
        "units_pass_ms_p50": round(statistics.median(r[0] for r in runs) * 1000, 1),
        "units_pass_ms_min": round(min(r[0] for r in runs) * 1000, 1),
        "units_ms_by_kind_p50": per_kind,
        "one_call_encoder_ms_p50": round(statistics.median(calls) * 1000, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }, indent=1))


if __name__ == "__main__":
    main()
