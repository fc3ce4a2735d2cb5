"""The peer for live speakers: `mlx_whisper.transcribe` run once per session, after the fact, one after another.

The same speaker signals `bench/live_serve.py` streams (the shared clips, or the synthetic voiced signal), each
transcribed whole by mlx-whisper, as a server without live sessions would have to: the total time against the
audio's real time says whether it could keep up with that many speakers at all (and it gives no text until each
recording ends). Modes: `default` (mlx-whisper's own defaults: the temperature fallback ladder) and `greedy`
(temperature 0 only, no fallback).

    python -m bench.whisper_sessions --whisper DIR --speakers 1,4,8,16 --seconds 15 --out FILE
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.json_lines import JsonLines
from engine.backend import ensure_fast_blas

ensure_fast_blas()  # a script entry point: the fast BLAS must be loaded before mlx is imported below

from bench.realtime_client import signals  # noqa: E402

__all__ = ["main"]

SR = 16000


def main(argv: list[str] | None = None) -> int:
    """Print one JSON line per (mode, speakers); `--out` gets them all. Returns 0."""
    import mlx_whisper

    p = argparse.ArgumentParser(prog="python -m bench.whisper_sessions")
    p.add_argument("--whisper", required=True, type=Path, help="a Whisper checkpoint directory")
    p.add_argument("--speakers", default="1,4,8,16")
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--samples", type=Path, default=None, help="WAV clips (default: the synthetic voiced signal)")
    p.add_argument("--modes", default="greedy,default")
    p.add_argument("--fp16", action="store_true", help="decode in float16 (a float16 checkpoint on a GPU)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    counts = [int(n) for n in args.speakers.split(",")]
    voices = [pcm for pcm, _ in signals(max(counts), args.seconds, args.samples)]
    # One untimed pass: loading the model and compiling kernels are not a session's cost.
    mlx_whisper.transcribe(voices[0][: SR * 2], path_or_hf_repo=str(args.whisper), fp16=args.fp16, language="en")
    results = JsonLines(args.out)
    for mode in args.modes.split(","):
        kw = {"temperature": 0.0} if mode == "greedy" else {}
        for n in counts:
            t0 = time.perf_counter()
            tokens = 0
            for pcm in voices[:n]:
                out = mlx_whisper.transcribe(pcm, path_or_hf_repo=str(args.whisper), fp16=args.fp16,
                                             language="en", **kw)
                tokens += sum(len(s["tokens"]) for s in out["segments"])
            took = time.perf_counter() - t0
            audio = max(len(v) for v in voices[:n]) / SR
            line = {"mode": mode, "speakers": n, "audio_s_each": round(audio, 1), "seconds": round(took, 2),
                    "x_real_time": round(took / audio, 2), "tokens": tokens}
            results.add(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
