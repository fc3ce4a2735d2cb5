"""What one Whisper decoder forward of R live rows costs, with each way of running it, in one process.

Rows come from random audio encoded over fitted contexts (two lengths, so the batch masks cross keys), each
decoding without end (end-of-text suppressed, so rows stay for the whole count, as random-init weights do).
Modes: `rows` (attention per row, the CPU default), `batch` (audio/decode_batch.py as built), `compiled` (the
same forward mx.compile'd, the GPU default). A forward is timed whole as serving runs it
(`step_rows`: forward, sampling, the one evaluation), median of `--forwards` after `--warm` untimed ones.

    python -m bench.decode_forward --whisper DIR --rows 1,4,8,16 --out FILE
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from bench.json_lines import JsonLines
from engine.backend import ensure_fast_blas

ensure_fast_blas()  # a script entry point: the fast BLAS must be loaded before mlx is imported below

import numpy as np

__all__ = ["main"]

MODES = {"rows": ("off", "off"), "batch": ("on", "off"), "compiled": ("on", "on")}


def main(argv: list[str] | None = None) -> int:
    """Print one JSON line per (mode, rows); `--out` gets them all. Returns 0."""
    from mlx_whisper.decoding import DecodingOptions
    from mlx_whisper.tokenizer import get_tokenizer

    from audio.decoder import new_row, step_rows
    from audio.encoder import EncoderJob, fitted_context, run_unit
    from audio.whisper import load_whisper

    p = argparse.ArgumentParser(prog="python -m bench.decode_forward")
    p.add_argument("--whisper", required=True, type=Path, help="a Whisper checkpoint directory")
    p.add_argument("--rows", default="1,2,4,8,16")
    p.add_argument("--modes", default="rows,batch,compiled")
    p.add_argument("--forwards", type=int, default=40)
    p.add_argument("--warm", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2, help="the modes in turn, this many times")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    loaded = load_whisper(args.whisper)
    fp16 = loaded.fp16
    counts = [int(n) for n in args.rows.split(",")]
    eot = get_tokenizer(loaded.model.is_multilingual, num_languages=loaded.model.num_languages).eot
    jobs = []
    for i in range(max(counts)):
        seconds = 4.0 if i % 2 else 12.0  # fitted contexts of two lengths (10 and 15 s)
        samples = int(seconds * 16000)
        audio = np.random.default_rng(i).normal(0, 0.1, samples).astype(np.float32)
        job = EncoderJob(audio, int(seconds * 100), 1500, fp16=fp16,
                         n_ctx=fitted_context(1500, samples, 10.0))
        while not job.done:
            run_unit(loaded.model, [job])
        jobs.append(job)
    results = JsonLines(args.out)
    for _ in range(args.rounds):
        for mode in args.modes.split(","):
            os.environ["TANDEM_WHISPER_BATCH"], os.environ["TANDEM_WHISPER_COMPILE"] = MODES[mode]
            for n in counts:
                options = DecodingOptions(language="en", fp16=fp16, suppress_tokens=[-1, eot])
                rows = [new_row(loaded.model, options, j.cross_kv, [], seed=i) for i, j in enumerate(jobs[:n])]
                for r in rows:
                    r.task.sample_len = 10 ** 6
                    r.task.n_ctx = 10 ** 6
                times = []
                for k in range(args.warm + args.forwards):
                    if any(r.length >= 440 for r in rows):
                        break  # the text context's end
                    t = time.perf_counter()
                    step_rows(loaded.model, rows)
                    if k >= args.warm:
                        times.append((time.perf_counter() - t) * 1e3)
                line = {"mode": mode, "rows": n, "forwards": len(times),
                        "ms_p50": round(statistics.median(times), 3) if times else None,
                        "ms_min": round(min(times), 3) if times else None}
                results.add(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
