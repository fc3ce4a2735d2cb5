"""Where a decode step's time goes on the GPU: the engine (no HTTP) decodes `--rows` streams; a window of steps in
the middle is bracketed with cuProfilerStart/Stop, so `ncu --profile-from-start off` times only those kernels. Run
alone it prints the engine's token gaps (the wall time per step to compare with the kernels' sum); under ncu, the
gaps are ncu's (it serializes kernels) and only the CSV matters (`--summarize CSV` turns it into a table).

    python3 -m bench.gpu.decode_kernels --tokenizer .gpu/tok --rows 1
    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum \\
        --csv --log-file k.csv python3 -m bench.gpu.decode_kernels --tokenizer .gpu/tok --rows 1
    python3 -m bench.gpu.decode_kernels --summarize k.csv --steps 48

Thirty-seventh session, H100 (Firecracker): run alone it gave 1 row 2.36 ms a step (p90 3.01), 8 rows 3.06 ms; under
ncu the device machine stopped answering, twice (with `dram__bytes_read.sum`, then with the time metric alone): no
kernel table yet, cause not established. Bound such a call with a short `timeout_s`.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import json
import time
from collections import defaultdict


class Profiler:
    """cuProfilerStart/Stop on the primary context (what MLX runs on); a no-op without libcuda."""

    def __init__(self) -> None:
        try:
            self.cuda = ctypes.CDLL("libcuda.so.1")
        except OSError:
            self.cuda = None
            return
        self.ctx = ctypes.c_void_p()
        dev = ctypes.c_int()
        self.cuda.cuInit(0)
        self.cuda.cuDeviceGet(ctypes.byref(dev), 0)
        self.cuda.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev)

    def _call(self, name: str) -> None:
        if self.cuda is None:
            return
        self.cuda.cuCtxPushCurrent_v2(self.ctx)
        getattr(self.cuda, name)()
        popped = ctypes.c_void_p()
        self.cuda.cuCtxPopCurrent_v2(ctypes.byref(popped))

    def start(self) -> None:
        self._call("cuProfilerStart")

    def stop(self) -> None:
        self._call("cuProfilerStop")


def run(tokenizer: str, rows: int, tokens: int, skip: int, window: int, shape: str = "llama-1b") -> dict:
    import anyio

    from bench.engine_compare import build, prompts
    from engine.contracts import GenerationRequest, SamplingParams
    from engine.runtime import Engine

    loaded = build(shape, tokenizer, "bfloat16")
    vocab = loaded.model.args.vocab_size
    profiler = Profiler()

    async def main() -> dict:
        eng = Engine(loaded, max_active=max(16, rows), max_iteration_tokens=512)
        out: dict = {"rows": rows}
        async with anyio.create_task_group() as tg:
            tg.start_soon(eng.serve)
            for phase in ("warm", "timed", "profiled"):
                stamps: list[list[float]] = [[] for _ in range(rows)]
                marks = {"start": None, "stop": None}

                async def one(i: int, p: list[int]) -> None:
                    req = GenerationRequest(prompt_tokens=p, sampling=SamplingParams(temperature=0.0),
                                            max_tokens=tokens)
                    async with eng.submit(req) as stream:
                        async for d in stream:
                            for _ in d.token_ids:
                                stamps[i].append(time.perf_counter())
                            if phase == "profiled" and i == 0:
                                if len(stamps[0]) >= skip and marks["start"] is None:
                                    profiler.start()
                                    marks["start"] = len(stamps[0])
                                elif len(stamps[0]) >= skip + window and marks["stop"] is None:
                                    profiler.stop()
                                    marks["stop"] = len(stamps[0])

                async with anyio.create_task_group() as inner:
                    for i, p in enumerate(prompts(rows, 128, vocab)):
                        inner.start_soon(one, i, p)
                if phase == "timed":
                    gaps = sorted(b - a for s in stamps for a, b in zip(s[skip:], s[skip + 1:]))
                    out["gap_ms_p50"] = round(1e3 * gaps[len(gaps) // 2], 3)
                    out["gap_ms_p90"] = round(1e3 * gaps[int(len(gaps) * 0.9)], 3)
                    out["tok_s_per_row"] = round(1e3 / out["gap_ms_p50"], 1)
                if phase == "profiled":
                    out["profiled_steps"] = (marks["stop"] or 0) - (marks["start"] or 0)
            eng.close()
        return out

    return anyio.run(main)


def summarize(path: str, steps: int) -> dict:
    """Kernels of an `ncu --csv` log grouped by name: launches, µs and bytes read, per step."""
    with open(path) as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    by: dict[str, dict[str, float]] = defaultdict(lambda: {"launches": 0, "us": 0.0, "mb_read": 0.0})
    seen: dict[str, set[str]] = defaultdict(set)
    for rec in csv.DictReader(lines[start:]):
        name = rec["Kernel Name"][:90]
        value = float(rec["Metric Value"].replace(",", "") or 0)
        unit = rec.get("Metric Unit", "")
        if rec["ID"] not in seen[name]:
            seen[name].add(rec["ID"])
            by[name]["launches"] += 1
        if rec["Metric Name"] == "gpu__time_duration.sum":
            by[name]["us"] += value / 1e3 if unit == "nsecond" else value * (1e3 if unit == "msecond" else 1)
        elif rec["Metric Name"] == "dram__bytes_read.sum":
            scale = {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3}.get(unit, 1e-6)
            by[name]["mb_read"] += value * scale
    total_us = sum(k["us"] for k in by.values())
    total_mb = sum(k["mb_read"] for k in by.values())
    table = sorted(by.items(), key=lambda kv: -kv[1]["us"])
    return {
        "steps": steps,
        "kernels_per_step": round(sum(k["launches"] for k in by.values()) / steps, 1),
        "gpu_us_per_step": round(total_us / steps, 1),
        "mb_read_per_step": round(total_mb / steps, 1),
        "gb_s_while_busy": round(total_mb / total_us * 1e3, 1) if total_us else None,
        "top": [{"kernel": n, "launches_per_step": round(k["launches"] / steps, 2), "us_per_step": round(k["us"] / steps, 1),
                 "mb_per_step": round(k["mb_read"] / steps, 1),
                 "gb_s": round(k["mb_read"] / k["us"] * 1e3, 1) if k["us"] else None} for n, k in table[:25]],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--shape", default="llama-1b")
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--skip", type=int, default=64, help="tokens before the profiled window")
    ap.add_argument("--window", type=int, default=48, help="tokens in the profiled window")
    ap.add_argument("--summarize", help="an ncu --csv log to summarize instead of running")
    ap.add_argument("--steps", type=int, default=48, help="with --summarize: the steps the log covers")
    a = ap.parse_args()
    if a.summarize:
        print(json.dumps(summarize(a.summarize, a.steps), indent=1))
        return
    print(json.dumps(run(a.tokenizer, a.rows, a.tokens, a.skip, a.window, a.shape)), flush=True)


if __name__ == "__main__":
    main()
