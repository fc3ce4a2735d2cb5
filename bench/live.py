"""Live speech benchmark, in process: sessions sustained with N speakers streaming in real time versus
mlx_whisper.transcribe run once per session, and chat inter-token latency alone versus with live sessions.

    uv run python -m bench.live [--speakers 1,4,8,16] [--seconds 30] [--itl-sessions 4] [--tokens 64]

Each speaker is the shared clips (TANDEM_AUDIO_SAMPLES) joined with 1.5 s pauses, starting at a different
clip, cut to about `--seconds`; it is fed in 250 ms chunks at real time. Per N: the largest lag any session
reported (sampled every 0.5 s), the time from the last chunk to the last transcript, WER, and how long the
engine thread spent per Whisper step and per LLM iteration. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np

__all__ = ["main"]

SR = 16000
CHUNK = SR // 4


def speakers(samples: Path, n: int, seconds: float) -> list[tuple[np.ndarray, str]]:
    """n speaker signals of about `seconds`, each starting at another clip. Raises SystemExit without clips."""
    from audio.pcm import load_audio_file

    wavs = sorted(samples.glob("*.wav"))
    if not wavs:
        raise SystemExit(f"no .wav files in {samples}")
    clips = [(load_audio_file(w), w.with_suffix(".txt").read_text().strip()) for w in wavs]
    gap = np.zeros(int(1.5 * SR), np.float32)
    out = []
    for k in range(n):
        parts, texts, total, i = [], [], 0, k
        while total < seconds * SR:
            pcm, text = clips[i % len(clips)]
            parts += [pcm, gap]
            texts.append(text)
            total += len(pcm) + len(gap)
            i += 1
        out.append((np.concatenate(parts), " ".join(texts)))
    return out


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return 0.0
    ys = sorted(xs)
    return round(ys[min(len(ys) - 1, int(p / 100 * len(ys)))], 4)


class StepClock:
    """Times every call the engine thread runs, by kind: a Whisper step, an LLM iteration, another task."""

    def __init__(self, engine: Any) -> None:
        from audio.scheduler import WhisperScheduler

        self.times: dict[str, list[float]] = {"whisper": [], "llm": [], "task": []}
        run = engine.thread.run

        async def timed(fn: Any, *args: Any) -> Any:
            owner = getattr(fn, "__self__", None)
            kind = "whisper" if isinstance(owner, WhisperScheduler) else \
                "llm" if type(owner).__name__ in ("LLMBatchGroup", "BatchStep") else "task"
            t0 = time.perf_counter()
            try:
                return await run(fn, *args)
            finally:
                self.times[kind].append(time.perf_counter() - t0)

        engine.thread.run = timed

    def summary(self) -> dict[str, Any]:
        return {k: {"n": len(v), "p50_ms": round(pct(v, 50) * 1000, 1), "p99_ms": round(pct(v, 99) * 1000, 1),
                    "max_ms": round(max(v, default=0.0) * 1000, 1)} for k, v in self.times.items() if v}


async def feed_live(speech: Any, signals: list[np.ndarray], lags: list[float]) -> tuple[list[Any], float]:
    """Stream every signal at real time into its own session; returns (transcripts, seconds from the last
    chunk to the last transcript)."""
    from audio.pcm import PcmFormat

    options = speech.options(language="en")
    sessions = [speech.create_session(options) for _ in signals]
    start = time.perf_counter()
    longest = max(len(x) for x in signals)
    async with anyio.create_task_group() as tg:
        async def watch() -> None:
            while True:
                lags.append(max(s.lag_seconds for s in sessions))
                await anyio.sleep(0.5)

        tg.start_soon(watch)
        for i in range(0, longest, CHUNK):
            for s, x in zip(sessions, signals):
                if i < len(x):
                    s.append(x[i:i + CHUNK].astype("<f4").tobytes(), PcmFormat())
            await anyio.sleep(max(0.0, start + (i + CHUNK) / SR - time.perf_counter()))  # a microphone's pace
        end = time.perf_counter()
        results = [await s.finish() for s in sessions]
        tail = time.perf_counter() - end
        tg.cancel_scope.cancel()
    for s in sessions:
        speech.delete_session(s.id)
    return results, tail


def run_speakers(path: Path, counts: list[int], seconds: float, samples: Path, budget: Any) -> list[dict[str, Any]]:
    import mlx_whisper

    from audio.speech import SpeechService
    from bench.wer import wer
    from engine.runtime import Engine

    rows = []
    for n in counts:
        voices = speakers(samples, n, seconds)
        engine = Engine(None)
        speech = SpeechService(engine.tasks, path, dtype="float32", resident=True, max_sessions=max(64, n),
                               budget=budget)
        clock = StepClock(engine)
        lags: list[float] = []

        async def run() -> tuple[list[Any], float]:
            async with anyio.create_task_group() as tg:
                tg.start_soon(engine.serve)
                await tg.start(speech.run)
                await speech.residency.preload()
                out = await feed_live(speech, [x for x, _ in voices], lags)
                tg.cancel_scope.cancel()
            return out

        t0 = time.perf_counter()
        transcripts, tail = anyio.run(run)
        wall = time.perf_counter() - t0
        engine.close()
        audio_s = max(len(x) for x, _ in voices) / SR
        # mlx_whisper once per session: each speaker's whole signal after the fact, one after another
        mlx_whisper.transcribe(voices[0][0][:SR], path_or_hf_repo=str(path), fp16=False, language="en")
        t1 = time.perf_counter()
        theirs = [mlx_whisper.transcribe(x, path_or_hf_repo=str(path), fp16=False, language="en")["text"]
                  for x, _ in voices]
        mlx_s = time.perf_counter() - t1
        row = {"speakers": n, "audio_s_each": round(audio_s, 1), "wall_s": round(wall, 1),
               "finish_after_last_chunk_s": round(tail, 2), "max_lag_s": round(max(lags, default=0.0), 2),
               "lag_at_end_of_audio_s": round(lags[int(audio_s * 2) - 1] if len(lags) >= int(audio_s * 2) else -1, 2),
               "sustained": tail <= 3.0,
               "wer_live": round(wer([r for _, r in voices], [t.text for t in transcripts]), 4),
               "mlx_whisper_once_per_session_s": round(mlx_s, 1),
               "mlx_whisper_over_real_time": round(mlx_s / audio_s, 2),
               "wer_mlx_whisper": round(wer([r for _, r in voices], theirs), 4),
               "engine_thread": clock.summary(), "scheduler": speech.scheduler.stats()}
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def run_itl(path: Path, sessions: int, tokens: int, samples: Path, budget: Any) -> dict[str, Any]:
    from audio.speech import SpeechService
    from engine.contracts import GenerationRequest, SamplingParams
    from engine.models import load_model
    from engine.runtime import Engine

    loaded = load_model(None)
    messages = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper and the sea."}]
    prompt = list(loaded.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    eos = set(getattr(loaded.tokenizer, "eos_token_ids", None) or []) | {loaded.tokenizer.eos_token_id}
    no_eos = {int(t): -100.0 for t in eos if t is not None}  # every measurement streams `tokens` tokens
    voices = [x for x, _ in speakers(samples, sessions, 30.0)]

    async def stream(engine: Engine) -> list[float]:
        gaps, last = [], None
        request = GenerationRequest(prompt, SamplingParams(temperature=0.0, logit_bias=no_eos), max_tokens=tokens)
        async with engine.submit(request) as rows:
            async for delta in rows:
                now = time.perf_counter()
                if last is not None and delta.token_ids:
                    gaps.append(now - last)
                last = now
        return gaps

    def paced_steps(speech: Any) -> dict[str, Any]:
        """Whisper steps that ran while chat decoded: how long, against their limit."""
        steps = [st for st in speech.scheduler.counters.steps if st.limit is not None]
        over = [st for st in steps if st.seconds > st.limit]
        return {"n": len(steps), "p50_ms": round(pct([st.seconds for st in steps], 50) * 1000, 1),
                "p99_ms": round(pct([st.seconds for st in steps], 99) * 1000, 1),
                "limit_p50_ms": round(pct([st.limit for st in steps], 50) * 1000, 1),
                "over_limit": len(over), "over_limit_kinds": sorted({st.kind for st in over}),
                "over_by_p99_ms": round(pct([st.seconds - st.limit for st in over], 99) * 1000, 1)}

    def measure(with_sessions: bool) -> tuple[list[float], dict[str, Any]]:
        engine = Engine(loaded)
        speech = SpeechService(engine.tasks, path, dtype="float32", resident=True, budget=budget,
                               pace=engine.chat_pace)
        clock = StepClock(engine)

        async def run() -> list[float]:
            async with anyio.create_task_group() as tg:
                tg.start_soon(engine.serve)
                await tg.start(speech.run)
                await speech.residency.preload()
                await stream(engine)  # warm-up: first-call costs stay out
                if with_sessions:
                    tg.start_soon(feed_live, speech, voices, [])
                    await anyio.sleep(3.0)  # let the sessions reach steady decoding
                gaps = await stream(engine)
                tg.cancel_scope.cancel()
            return gaps

        gaps = anyio.run(run)
        engine.close()
        summary = clock.summary()
        if with_sessions:
            summary["whisper_steps_while_chat_decoded"] = paced_steps(speech)
        return gaps, summary

    alone, clock_alone = measure(False)
    shared, clock_shared = measure(True)
    return {"sessions": sessions, "tokens": tokens,
            "itl_alone_ms": {"p50": round(pct(alone, 50) * 1000, 1), "p99": round(pct(alone, 99) * 1000, 1)},
            "itl_with_sessions_ms": {"p50": round(pct(shared, 50) * 1000, 1), "p99": round(pct(shared, 99) * 1000, 1)},
            "p99_ratio": round(pct(shared, 99) / max(pct(alone, 99), 1e-9), 2),
            "p50_ratio": round(pct(shared, 50) / max(pct(alone, 50), 1e-9), 2),
            "engine_thread_alone": clock_alone, "engine_thread_with_sessions": clock_shared}


def main(argv: list[str] | None = None) -> int:
    """Run the live benchmark and print JSON. Raises SystemExit for missing samples or model."""
    p = argparse.ArgumentParser(prog="bench.live", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="Whisper checkpoint (default: demo tiny.en)")
    p.add_argument("--samples", default=os.environ.get("TANDEM_AUDIO_SAMPLES", "../shared/audio"))
    p.add_argument("--speakers", default="1,4,8,16")
    p.add_argument("--seconds", type=float, default=30.0, help="audio per speaker")
    p.add_argument("--itl-sessions", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64, help="chat tokens per ITL measurement")
    p.add_argument("--skip-itl", action="store_true")
    p.add_argument("--skip-speakers", action="store_true")
    p.add_argument("--encoder-positions", type=int, default=375, help="StepBudget.encoder_positions")
    p.add_argument("--decode-tokens", type=int, default=4, help="StepBudget.decode_tokens")
    p.add_argument("--chat-share", type=float, default=0.3, help="StepBudget.chat_share")
    args = p.parse_args(argv)

    from audio.scheduler import StepBudget

    from audio.whisper import resolve_whisper_checkpoint
    from engine.backend import blas_info

    path = resolve_whisper_checkpoint(args.model, "float32")
    samples = Path(args.samples)
    budget = StepBudget(encoder_positions=args.encoder_positions, decode_tokens=args.decode_tokens,
                        chat_share=args.chat_share)
    report: dict[str, Any] = {"machine": {"blas": blas_info().describe(), "cpu_count": os.cpu_count(),
                                          "load_avg": os.getloadavg()}, "model": str(path),
                              "budget": {"encoder_positions": budget.encoder_positions,
                                         "decode_tokens": budget.decode_tokens, "chat_share": budget.chat_share}}
    if not args.skip_speakers:
        report["speakers"] = run_speakers(path, [int(x) for x in args.speakers.split(",")], args.seconds, samples,
                                          budget)
    if not args.skip_itl:
        report["chat_itl"] = run_itl(path, args.itl_sessions, args.tokens, samples, budget)
    report["machine"]["load_avg_end"] = os.getloadavg()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
