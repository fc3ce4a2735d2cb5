"""Live speech against a running `tandem serve` (or one this script starts), over the wire: OpenAI Realtime
transcription sessions streaming audio in real time, and streamed chat beside them.

    python -m bench.live_serve --server http://127.0.0.1:8080 [--samples DIR] [--speakers 1,4,8,16]
        [--seconds 30] [--itl-sessions 4] [--tokens 64] [--latency] [--out FILE]
    python -m bench.live_serve --serve "tiny.en --whisper-resident --preload" ...   # start the server here

- **latency** (one speaker): per utterance, the first tentative (or committed) word after its speech onset
  was sent, and its final transcript (`completed`) after its speech end was sent.
- **speakers**: N sessions at real time, each a signal of about `--seconds`; per N the longest time from a
  session's last chunk to its last transcript ("finish after"), the largest lag /stats reported, and whether
  every session kept up (finish after ≤ 3 s).
- **chat ITL**: a streamed chat answer's inter-token gaps alone, then while `--itl-sessions` sessions stream.

Audio: the WAV clips in `--samples` (16 kHz mono 16-bit, e.g. the shared samples), joined with 1.5 s pauses;
without them a synthetic voiced signal (bursts of a buzzing vowel) that the VAD takes for speech. Prints one
JSON document (and writes it to --out).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx

from bench.realtime_client import SR, SessionRun, realtime_url, signals, stream_session
from bench.serve_procs import exit_on_sigterm

__all__ = ["main", "signals", "SessionRun"]


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    ys = sorted(xs)
    return round(ys[min(len(ys) - 1, int(p / 100 * len(ys)))], 4)


async def sample_lag(root: str, headers: dict[str, str], lags: list[float], stop: anyio.Event) -> None:
    async with httpx.AsyncClient(timeout=10, headers=headers) as http:
        while not stop.is_set():
            try:
                lags.append(float(((await http.get(f"{root}/stats")).json().get("speech") or {})
                                  .get("session_lag_s_max", 0.0)))
            except (httpx.HTTPError, ValueError):
                pass
            await anyio.sleep(0.5)  # sampling period


COUNTED = ("windows_done", "encoder_steps", "decoder_steps", "fallbacks", "whole_window_redos", "paced_steps")


async def scheduler_stats(root: str, headers: dict[str, str]) -> dict[str, Any]:
    """The speech scheduler's part of /stats ({} when the server has none). Raises httpx.HTTPError."""
    async with httpx.AsyncClient(timeout=10, headers=headers) as http:
        return dict(((await http.get(f"{root}/stats")).json().get("speech") or {}).get("scheduler") or {})


async def run_speakers(root: str, ws_url: str, headers: dict[str, str], n: int, seconds: float,
                       samples: Path | None) -> dict[str, Any]:
    voices = signals(n, seconds, samples)
    runs = [SessionRun() for _ in voices]
    lags: list[float] = []
    stop = anyio.Event()
    t0 = time.perf_counter()
    before = await scheduler_stats(root, headers)
    async with anyio.create_task_group() as tg:
        tg.start_soon(sample_lag, root, headers, lags, stop)
        async with anyio.create_task_group() as sessions:
            for (pcm, _), run in zip(voices, runs):
                sessions.start_soon(stream_session, ws_url, pcm, headers, run)
        stop.set()
    after = await scheduler_stats(root, headers)
    tails = [r.done - r.last_chunk for r in runs if r.error is None]
    lat = [row for (_, marks), r in zip(voices, runs) for row in r.latencies(marks)]
    words = [x["first_word_s"] for x in lat if x["first_word_s"] is not None]
    finals = [x["final_s"] for x in lat if x["final_s"] is not None]
    return {"speakers": n, "audio_s_each": round(max(len(p) for p, _ in voices) / SR, 1),
            "wall_s": round(time.perf_counter() - t0, 1), "errors": [r.error for r in runs if r.error],
            "finish_after_last_chunk_s_max": round(max(tails), 2) if tails else None,
            "max_lag_s": round(max(lags, default=0.0), 2), "sustained": bool(tails) and max(tails) <= 3.0,
            "first_word_after_onset_s": {"p50": pct(words, 50), "max": pct(words, 100), "n": len(words)},
            "final_after_speech_end_s": {"p50": pct(finals, 50), "max": pct(finals, 100), "n": len(finals)},
            "clips": lat if n == 1 else None,
            # what the Whisper scheduler did for this round: steps by kind, rows per decoder step, step times
            "scheduler": {**{k: after.get(k, 0) - before.get(k, 0) for k in COUNTED},
                          "recent_steps": after.get("recent_steps"), "costs": after.get("costs"),
                          "encoder_positions_per_step": after.get("encoder_positions_per_step"),
                          "decode_tokens_per_step": after.get("decode_tokens_per_step")}}  # one speaker: per clip, to see which utterance makes a maximum


async def run_itl(root: str, ws_url: str, headers: dict[str, str], sessions: int, tokens: int, rounds: int,
                  samples: Path | None, model: str | None) -> dict[str, Any]:
    from bench.serve_client import chat_body, stream_chat

    body = chat_body("You are a storyteller.", "Tell me a long story about a lighthouse keeper and the sea.",
                     tokens, model)

    async def gaps() -> tuple[list[float], int]:
        out, tokens_seen = [], 0
        async with httpx.AsyncClient(timeout=None, headers=headers) as http:
            for _ in range(rounds):
                res = await stream_chat(http, f"{root}/v1/chat/completions", body, timeout=600)
                if res.error:
                    raise SystemExit(f"chat failed: {res.error}")
                out += [b - a for a, b in zip(res.chunk_times, res.chunk_times[1:])]
                tokens_seen += len(res.chunk_times)
        return out, tokens_seen

    await gaps()  # warm-up: first-call costs stay out
    # /stats is sampled at the same period alone as beside the sessions: both sides carry the same polling.
    polled: list[float] = []
    stop_alone = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(sample_lag, root, headers, polled, stop_alone)
        alone, n_alone = await gaps()
        stop_alone.set()
    voices = signals(sessions, 30.0, samples)
    stop = anyio.Event()
    runs = [SessionRun() for _ in voices]
    async with anyio.create_task_group() as tg:
        for (pcm, _), run in zip(voices, runs):
            tg.start_soon(stream_session, ws_url, pcm, headers, run, stop)
        await anyio.sleep(3.0)  # let the sessions reach steady decoding
        lags: list[float] = []  # whether speech keeps up while chat runs, not only chat's gaps
        tg.start_soon(sample_lag, root, headers, lags, stop)
        shared, n_shared = await gaps()
        # Read while the sessions still stream: their last windows, decoded once chat is idle, stay out.
        async with httpx.AsyncClient(timeout=10, headers=headers) as http:
            doc = (await http.get(f"{root}/stats")).json()
        stop.set()
    stats = {**((doc.get("speech") or {}).get("scheduler") or {}),
             "chat_iteration_times": doc.get("iteration_times"), "gc": doc.get("gc")}
    a50, a99, s50, s99 = pct(alone, 50), pct(alone, 99), pct(shared, 50), pct(shared, 99)
    return {"sessions": sessions, "tokens_alone": n_alone, "tokens_with_sessions": n_shared,
            "itl_alone_ms": {"p50": round(a50 * 1e3, 1) if a50 else None, "p99": round(a99 * 1e3, 1) if a99 else None,
                             "max": round(max(alone, default=0.0) * 1e3, 1)},
            "itl_with_sessions_ms": {"p50": round(s50 * 1e3, 1) if s50 else None,
                                     "p99": round(s99 * 1e3, 1) if s99 else None,
                                     "max": round(max(shared, default=0.0) * 1e3, 1)},
            "p50_ratio": round(s50 / a50, 2) if a50 and s50 else None,
            "p99_ratio": round(s99 / a99, 2) if a99 and s99 else None,
            "session_lag_s_max": round(max(lags, default=0.0), 2),
            "session_errors": [r.error for r in runs if r.error], "scheduler": stats}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark against a server and print JSON. Raises SystemExit for bad arguments."""
    p = argparse.ArgumentParser(prog="bench.live_serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default="http://127.0.0.1:8080")
    p.add_argument("--serve", default=None, help="start `tandem serve <ARGS>` on the --server port first")
    p.add_argument("--ready-timeout", type=float, default=240.0)
    p.add_argument("--api-key", default=os.environ.get("TANDEM_API_KEY"))
    p.add_argument("--samples", default=os.environ.get("TANDEM_AUDIO_SAMPLES"))
    p.add_argument("--speakers", default="1,4,8,16", help="comma-separated; empty: skip")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--latency", action="store_true", help="one speaker, per-utterance latencies (first)")
    p.add_argument("--itl-sessions", type=int, default=4, help="0: skip the chat measurement")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="chat answers per ITL measurement")
    p.add_argument("--model", default=None, help="chat model id (default: the served one)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, exit_on_sigterm)  # `timeout` ends the run: the server it started stops too
    root = args.server.rstrip("/")
    ws_url = realtime_url(root)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    samples = Path(args.samples) if args.samples else None
    server = None
    if args.serve:
        from bench.serve_procs import Server

        port = root.rsplit(":", 1)[-1]
        argv_ = [sys.executable, "-m", "service.cli", "serve", *shlex.split(args.serve), "--port", port]
        server = Server("tandem", argv_, root, Path(args.out or "live_serve").with_suffix(".server.log"))
        server.start()
        server.wait_ready("/health", args.ready_timeout)
    report: dict[str, Any] = {"server": root, "samples": str(samples) if samples else "synthetic",
                              "load_avg": os.getloadavg()}
    try:
        if args.latency:
            report["latency"] = anyio.run(run_speakers, root, ws_url, headers, 1, args.seconds, samples)
        if args.itl_sessions > 0:
            report["chat_itl"] = anyio.run(run_itl, root, ws_url, headers, args.itl_sessions, args.tokens, args.rounds,
                                           samples, args.model)
        report["speakers"] = [anyio.run(run_speakers, root, ws_url, headers, int(n), args.seconds, samples)
                              for n in args.speakers.split(",") if n.strip()]
    finally:
        if server is not None:
            server.stop()
    report["load_avg_end"] = os.getloadavg()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
