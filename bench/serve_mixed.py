"""The hardening soak (issue 9): mixed chat streams and file transcriptions in closed loops for N minutes,
10 % of requests dropped by their client at a random point, and halfway a burst of 3 × the server's
--max-queued chat requests sent at once.

Reported: requests served by kind, errors by kind (only 429 is expected: the burst past the queue bound),
server RSS at the start and the end, and latency (end to end, TTFT) of admitted chat requests started
before the burst vs during it — whether the bounded queue keeps admitted requests' latency.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import anyio
import httpx

from bench.serve_scenarios import Request, Scenario, scenario_requests
from bench.serve_stats import RequestResult, _ms, percentile

__all__ = ["MixedRun", "run_mixed", "drive_mixed", "transcribe_file", "summarize_mixed", "clip_bytes"]

# What the soak's own clients wait after a 429 (the server's Retry-After for queue_full).
RETRY_AFTER_S = 1.0
ChatSend = Callable[[Request, float], Awaitable[RequestResult]]  # (request, timeout s)
SpeechSend = Callable[[float, float | None], Awaitable[RequestResult]]  # (timeout, hang up after s or None)


@dataclass
class MixedRun:
    """Every request of a mixed soak: (kind, result), kind "chat", "speech" or "burst"; the burst window."""

    records: list[tuple[str, RequestResult]] = field(default_factory=list)
    t0: float = 0.0
    burst_start: float = 0.0
    burst_end: float = 0.0
    burst_size: int = 0


def clip_bytes(path: str | None) -> bytes:
    """The audio every transcription request uploads: `path`, else the first WAV of $TANDEM_AUDIO_SAMPLES,
    else 5 s of a synthetic voiced signal as 16-bit WAV. Raises OSError for an unreadable `path`."""
    import io
    import os
    import wave
    from pathlib import Path

    if path:
        return Path(path).read_bytes()
    samples = os.environ.get("TANDEM_AUDIO_SAMPLES")
    if samples and (found := sorted(Path(samples).glob("*.wav"))):
        return found[0].read_bytes()
    import numpy as np

    t = np.arange(5 * 16000) / 16000
    x = ((t * 150) % 1.0 - 0.5) * 0.5 * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t))
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((x * 32767).astype("<i2").tobytes())
    return buf.getvalue()


async def transcribe_file(client: httpx.AsyncClient, url: str, audio: bytes, timeout: float,
                          hang_up_after: float | None) -> RequestResult:
    """POST one file to /v1/audio/transcriptions; `hang_up_after` seconds: the client leaves then.
    Raises nothing (errors land in .error)."""
    res = RequestResult(t_start=time.perf_counter())
    try:
        with anyio.fail_after(timeout):
            with anyio.move_on_after(hang_up_after if hang_up_after is not None else timeout + 1) as cut:
                resp = await client.post(url, files={"file": ("clip.wav", audio, "audio/wav")},
                                         data={"model": "whisper-1", "response_format": "json"})
                res.status = resp.status_code
                if resp.status_code != 200:
                    res.error = f"http_{resp.status_code}: {resp.text[:300]}"
                elif not isinstance(resp.json().get("text"), str):
                    res.error = "empty: no text in the transcription"
            if cut.cancelled_caught:
                res.disconnected = True
    except TimeoutError:
        res.error = f"timeout: no answer within {timeout:.0f} s"
    except (httpx.HTTPError, OSError, ValueError) as exc:
        res.error = f"transport: {type(exc).__name__}: {exc}"[:300]
    finally:
        res.t_end = time.perf_counter()
    return res


async def run_mixed(s: Scenario, chat: ChatSend, speech: SpeechSend, burst_size: int, timeout: float,
                    deadline: float, seed: int = 0) -> MixedRun:
    """Drive the mixed soak; returns every request with its kind. Raises nothing."""
    run = MixedRun(t0=time.perf_counter(), burst_size=burst_size)
    end = min(deadline, run.t0 + s.minutes * 60.0)
    run.burst_start = run.t0 + s.burst_at * (end - run.t0)
    rng = random.Random(f"{seed}/{s.name}/speech")
    requests = scenario_requests(s, seed)

    async def chat_worker() -> None:
        for req in requests:
            if time.perf_counter() >= end:
                return
            result = await chat(req, min(timeout, deadline - time.perf_counter()))
            run.records.append(("chat", result))
            if result.status == 429:  # a client that honours the server's Retry-After (1 s)
                await anyio.sleep(RETRY_AFTER_S)

    async def speech_worker() -> None:
        while time.perf_counter() < end:
            # A dropped upload leaves at a random point of a typical transcription (here: within 3 s).
            hang_up = rng.uniform(0.0, 3.0) if rng.random() < s.disconnect else None
            run.records.append(("speech", await speech(min(timeout, deadline - time.perf_counter()), hang_up)))

    async def burst() -> None:
        await anyio.sleep(max(0.0, run.burst_start - time.perf_counter()))  # the schedule, not a sync point
        run.burst_start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(burst_size):
                req = Request(10_000_000 + i, s.prompt_tokens[0], s.max_tokens[1])

                async def one(req: Request = req) -> None:
                    run.records.append(("burst", await chat(req, min(timeout, deadline - time.perf_counter()))))

                tg.start_soon(one)
        run.burst_end = time.perf_counter()

    async with anyio.create_task_group() as tg:
        for _ in range(s.concurrency):
            tg.start_soon(chat_worker)
        for _ in range(s.speech_streams):
            tg.start_soon(speech_worker)
        if burst_size:
            tg.start_soon(burst)
    return run


async def drive_mixed(base: str, s: Scenario, burst: int, deadline: float, options: Any,
                      body: Callable[[Request], dict[str, Any]]) -> MixedRun:
    """run_mixed against the server at `base`: chat through the streaming client (`body(request)` builds
    each request), transcriptions of `options.audio` (clip_bytes). Raises nothing."""
    from bench.serve_client import make_client, stream_chat

    audio = clip_bytes(options.audio)
    async with make_client() as client:

        async def chat(req: Request, timeout: float) -> RequestResult:
            return await stream_chat(client, base + "/v1/chat/completions", body(req), timeout, req.disconnect_after)

        async def speech(timeout: float, hang_up: float | None) -> RequestResult:
            return await transcribe_file(client, base + "/v1/audio/transcriptions", audio, timeout, hang_up)

        return await run_mixed(s, chat, speech, burst, options.timeout, deadline, options.seed)


def _latency(results: list[RequestResult]) -> dict[str, Any]:
    e2e = [r.t_end - r.t_start for r in results]
    ttft = [r.ttft for r in results if r.ttft is not None]
    return {"n": len(results), "e2e_ms": {f"p{p}": _ms(percentile(e2e, p)) for p in (50, 99)},
            "ttft_ms": {f"p{p}": _ms(percentile(ttft, p)) for p in (50, 99)}}


def _itl_by_window(results: list[RequestResult], start: float, end: float) -> dict[str, Any]:
    """Per-token gaps of running streams, split by when the token arrived: before `start`, or in
    [start, end] (a chunk of k tokens arriving g after the previous one gives k gaps of g/k)."""
    before: list[float] = []
    during: list[float] = []
    for r in results:
        tokens = r.chunk_tokens or [1] * len(r.chunk_times)
        for i in range(1, len(r.chunk_times)):
            k = max(1, tokens[i])
            gaps = [(r.chunk_times[i] - r.chunk_times[i - 1]) / k] * k
            if r.chunk_times[i] < start:
                before += gaps
            elif r.chunk_times[i] <= end:
                during += gaps
    return {label: {"n": len(xs), **{f"p{p}": _ms(percentile(xs, p)) for p in (50, 99)}}
            for label, xs in (("before_burst", before), ("during_burst", during))}


def summarize_mixed(run: MixedRun) -> dict[str, Any]:
    """Served and refused per kind, errors by kind, and the latency of admitted (200, answered in full) chat
    requests started before the burst vs during it. Raises nothing."""
    by_kind: dict[str, dict[str, Any]] = {}
    errors: Counter[str] = Counter()
    for kind, r in run.records:
        row = by_kind.setdefault(kind, {"sent": 0, "served": 0, "disconnected": 0, "refused_429": 0, "failed": 0})
        row["sent"] += 1
        if r.error is None:
            row["disconnected" if r.disconnected else "served"] += 1
        else:
            reason = r.error.split(":")[0]
            errors[reason] += 1
            row["refused_429" if reason == "http_429" else "failed"] += 1
    admitted = [(k, r) for k, r in run.records if k != "speech" and r.error is None and not r.disconnected]
    before = [r for _, r in admitted if r.t_start < run.burst_start]
    during = [r for _, r in admitted if run.burst_start <= r.t_start <= max(run.burst_end, run.burst_start)]
    return {
        "burst": {"size": run.burst_size, "at_s": round(run.burst_start - run.t0, 1),
                  "lasted_s": round(max(0.0, run.burst_end - run.burst_start), 1)},
        "by_kind": by_kind,
        "errors_by_kind": dict(errors),
        "unexpected_errors": sum(n for reason, n in errors.items() if reason != "http_429"),
        "admitted_chat_before_burst": _latency(before),
        "admitted_chat_during_burst": _latency(during),
        # Streams already running: does the burst slow their tokens down?
        "itl_ms": _itl_by_window([r for _, r in admitted], run.burst_start, max(run.burst_end, run.burst_start)),
    }
