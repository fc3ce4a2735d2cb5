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
- **speakers beside chat** (`--speakers-beside-chat TOKENS`): the speaker rounds while a chat client streams
  answers back to back; with `--gap-s 0` each speaker is one long utterance (`first_text_s`: its first text after its
  first chunk).

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


COUNTED = ("windows_done", "encoder_steps", "decoder_steps", "encode_s", "decode_s", "fallbacks", "whole_window_redos",
           "paced_steps")


async def scheduler_stats(root: str, headers: dict[str, str]) -> dict[str, Any]:
    """The speech scheduler's part of /stats ({} when the server has none). Raises httpx.HTTPError."""
    async with httpx.AsyncClient(timeout=10, headers=headers) as http:
        return dict(((await http.get(f"{root}/stats")).json().get("speech") or {}).get("scheduler") or {})


async def chat_answers(root: str, headers: dict[str, str], tokens: int, model: str | None, gaps: list[float],
                       rounds: int | None = None, stop: anyio.Event | None = None) -> int:
    """Streamed chat answers back to back (`rounds` of them, or until `stop`), their token gaps into `gaps`;
    returns the chunks seen. Raises SystemExit when an answer fails."""
    from bench.serve_client import chat_body, stream_chat

    body = chat_body("You are a storyteller.", "Tell me a long story about a lighthouse keeper and the sea.",
                     tokens, model)
    seen, done = 0, 0
    async with httpx.AsyncClient(timeout=None, headers=headers) as http:
        while (rounds is None or done < rounds) and not (stop is not None and stop.is_set()):
            res = await stream_chat(http, f"{root}/v1/chat/completions", body, timeout=600)
            if res.error:
                raise SystemExit(f"chat failed: {res.error}")
            gaps += [b - a for a, b in zip(res.chunk_times, res.chunk_times[1:])]
            seen, done = seen + len(res.chunk_times), done + 1
    return seen


async def run_speakers(root: str, ws_url: str, headers: dict[str, str], n: int, seconds: float,
                       samples: Path | None, gap_s: float = 1.5, chat_tokens: int = 0,
                       model: str | None = None) -> dict[str, Any]:
    """`chat_tokens` > 0: a chat client streams answers of that many tokens back to back while the sessions run
    (speech beside a busy chat, from the sessions' side). Raises what the sessions' and chat's clients raise."""
    voices = signals(n, seconds, samples, gap_s)
    runs = [SessionRun() for _ in voices]
    lags: list[float] = []
    chat_gaps: list[float] = []
    stop = anyio.Event()  # the sessions are done: the /stats sampling and the chat client stop
    t0 = time.perf_counter()
    before = await scheduler_stats(root, headers)
    async with anyio.create_task_group() as tg:
        tg.start_soon(sample_lag, root, headers, lags, stop)
        if chat_tokens > 0:
            tg.start_soon(chat_answers, root, headers, chat_tokens, model, chat_gaps, None, stop)
        async with anyio.create_task_group() as sessions:
            for (pcm, _), run in zip(voices, runs):
                sessions.start_soon(stream_session, ws_url, pcm, headers, run)
        stop.set()
    after = await scheduler_stats(root, headers)
    tails = [r.done - r.last_chunk for r in runs if r.error is None]
    lat = [row for (_, marks), r in zip(voices, runs) for row in r.latencies(marks)]
    words = [x["first_word_s"] for x in lat if x["first_word_s"] is not None]
    finals = [x["final_s"] for x in lat if x["final_s"] is not None]
    # When each session showed new text (a guess, a delta or a transcript), from its first chunk on.
    shown = [[t for t, e in r.events if e.get("type", "").endswith(("transcription.tentative", "transcription.delta",
                                                                    "transcription.completed"))
              and (e.get("text") or e.get("delta") or e.get("transcript"))] for r in runs]
    first_text = [ts[0] - r.sent_at[0] for ts, r in zip(shown, runs) if ts and r.sent_at]
    # The longest a session's speaker waited for new text while their audio went out (and after, until the end).
    waits = [max(b - a for a, b in zip([r.sent_at[0], *ts], ts)) for ts, r in zip(shown, runs) if ts and r.sent_at]
    return {"speakers": n, "audio_s_each": round(max(len(p) for p, _ in voices) / SR, 1), "gap_s": gap_s,
            "wall_s": round(time.perf_counter() - t0, 1), "errors": [r.error for r in runs if r.error],
            "finish_after_last_chunk_s_max": round(max(tails), 2) if tails else None,
            "max_lag_s": round(max(lags, default=0.0), 2), "sustained": bool(tails) and max(tails) <= 3.0,
            "first_word_after_onset_s": {"p50": pct(words, 50), "max": pct(words, 100), "n": len(words)},
            "final_after_speech_end_s": {"p50": pct(finals, 50), "max": pct(finals, 100), "n": len(finals)},
            "clips": lat if n == 1 else None,
            # each session's first text after its first chunk was sent: with gap_s 0, all one utterance
            "first_text_s": {"p50": pct(first_text, 50), "max": pct(first_text, 100), "n": len(first_text)},
            "longest_wait_for_text_s": {"p50": pct(waits, 50), "max": pct(waits, 100), "n": len(waits)},
            "chat_beside": {"tokens": chat_tokens, "gaps": len(chat_gaps),
                            "itl_ms": {"p50": round(1e3 * (pct(chat_gaps, 50) or 0), 1),
                                       "p99": round(1e3 * (pct(chat_gaps, 99) or 0), 1)}} if chat_tokens > 0 else None,
            # what the Whisper scheduler did for this round: steps by kind, rows per decoder step, step times
            "scheduler": {**{k: round(after.get(k, 0) - before.get(k, 0), 3) for k in COUNTED},
                          "recent_steps": after.get("recent_steps"), "costs": after.get("costs"),
                          "encoder_positions_per_step": after.get("encoder_positions_per_step"),
                          "decode_tokens_per_step": after.get("decode_tokens_per_step")}}  # one speaker: per clip, to see which utterance makes a maximum


async def run_itl(root: str, ws_url: str, headers: dict[str, str], sessions: int, tokens: int, rounds: int,
                  samples: Path | None, model: str | None) -> dict[str, Any]:
    async def gaps() -> tuple[list[float], int]:
        out: list[float] = []
        return out, await chat_answers(root, headers, tokens, model, out, rounds)

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
    p = argparse.ArgumentParser(prog="tandem benchmark live", description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default="http://127.0.0.1:8080")
    p.add_argument("--serve", default=None, help="start `tandem serve <ARGS>` on the --server port first")
    p.add_argument("--ready-timeout", type=float, default=240.0)
    p.add_argument("--api-key", default=os.environ.get("TANDEM_API_KEY"))
    p.add_argument("--samples", default=os.environ.get("TANDEM_AUDIO_SAMPLES"))
    p.add_argument("--speakers", default="1,4,8,16", help="comma-separated; empty: skip")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--latency", action="store_true", help="one speaker, per-utterance latencies (first)")
    p.add_argument("--gap-s", type=float, default=1.5,
                   help="silence between the clips of a speaker's signal (0: one utterance the VAD never closes)")
    p.add_argument("--speakers-beside-chat", type=int, default=0, metavar="TOKENS",
                   help="during the speaker rounds a chat client streams answers of TOKENS tokens back to back")
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
        report["speakers"] = [anyio.run(run_speakers, root, ws_url, headers, int(n), args.seconds, samples,
                                        args.gap_s, args.speakers_beside_chat, args.model)
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
