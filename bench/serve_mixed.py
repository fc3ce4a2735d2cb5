"""The hardening soak (issue 9): mixed chat streams, file transcriptions and live Realtime transcription
sessions in closed loops for N minutes, 10 % of requests dropped by their client at a random point, halfway a
burst of 3 × the server's --max-queued chat requests sent at once, and optionally the engine process of an
`--isolate` server killed once.

Reported: requests served by kind, errors by kind (expected: 429 for the burst past the queue bound, and
after a kill the requests in flight at it and 503s until the engine is back), server RSS at the start and
the end, and latency (end to end, TTFT) of admitted chat requests started before the burst vs during it —
whether the bounded queue keeps admitted requests' latency.
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import anyio
import httpx

from bench.serve_scenarios import Request, Scenario, scenario_requests
from bench.serve_stats import RequestResult, _ms, percentile

__all__ = ["MixedRun", "run_mixed", "drive_mixed", "transcribe_file", "live_session", "summarize_mixed",
           "clip_bytes"]

# What the soak's own clients wait after a 503 while an engine process restarts (a back-off, not a sync point).
RESTART_WAIT_S = 2.0
# The command line of an --isolate server's engine process (what the soak's fault kills).
ENGINE_MARKER = "service.isolate.host"
# What the soak's own clients wait after a 429 (the server's Retry-After for queue_full).
RETRY_AFTER_S = 1.0
ChatSend = Callable[[Request, float], Awaitable[RequestResult]]  # (request, timeout s)
SpeechSend = Callable[[float, float | None], Awaitable[RequestResult]]  # (timeout, hang up after s or None)
# (timeout, hang up after this fraction of the audio or None): one live session start to end.
LiveSend = Callable[[float, float | None], Awaitable[RequestResult]]
# Kill the engine process, then return when the server was healthy again (None: not before the given
# perf_counter time). Raises LookupError when there is no engine process to kill.
Kill = Callable[[float], Awaitable[float | None]]


@dataclass
class MixedRun:
    """Every request of a mixed soak: (kind, result), kind "chat", "speech", "live" or "burst"; the burst
    window; when the engine process was killed and when the server was healthy again (0: not killed / never)."""

    records: list[tuple[str, RequestResult]] = field(default_factory=list)
    t0: float = 0.0
    burst_start: float = 0.0
    burst_end: float = 0.0
    burst_size: int = 0
    kill_at: float = 0.0
    back_at: float = 0.0
    kill_error: str = ""


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


async def live_session(url: str, pcm: Any, timeout: float, hang_up_at: float | None,
                       headers: dict[str, str] | None = None) -> RequestResult:
    """One Realtime transcription session streaming `pcm` (float samples at 16 kHz) at real time, then the
    final commit's transcripts; `hang_up_at` (a fraction of the audio): the client closes the socket once
    that much is sent. Raises nothing: errors land in .error ("KIND: detail", KIND error_event, http_N,
    closed, transport, timeout, or cut: the socket ended normally before the last transcripts)."""
    from bench.realtime_client import SR, SessionRun, stream_session

    run = SessionRun()
    res = RequestResult(t_start=time.perf_counter())
    cut_after = hang_up_at * len(pcm) / SR if hang_up_at is not None else timeout + 1
    with anyio.move_on_after(timeout) as whole:
        with anyio.move_on_after(cut_after) as cut:
            await stream_session(url, pcm, headers or {}, run)
    res.t_end = time.perf_counter()
    res.chunk_times = [t for t, e in run.events if str(e.get("type", "")).endswith("transcription.completed")]
    if run.error is not None:
        res.error = run.error
        if run.error.startswith("http_"):
            res.status = int(run.error[5:8])
    elif cut.cancelled_caught:
        res.disconnected = True
    elif whole.cancelled_caught:
        res.error = f"timeout: the last transcript not within {timeout:.0f} s"
    elif not run.complete:
        res.error = "cut: the socket ended before the last transcripts"
    return res


async def run_mixed(s: Scenario, chat: ChatSend, speech: SpeechSend, burst_size: int, timeout: float,
                    deadline: float, seed: int = 0, live: LiveSend | None = None, kill: Kill | None = None,
                    kill_at: float | None = None) -> MixedRun:
    """Drive the mixed soak; returns every request with its kind. With `live`, s.live_streams clients run
    live sessions; with `kill`, it is called once at `kill_at` (a fraction of the soak). Raises nothing."""
    run = MixedRun(t0=time.perf_counter(), burst_size=burst_size)
    end = min(deadline, run.t0 + s.minutes * 60.0)
    run.burst_start = run.t0 + s.burst_at * (end - run.t0)
    rng = random.Random(f"{seed}/{s.name}/speech")
    live_rng = random.Random(f"{seed}/{s.name}/live")
    requests = scenario_requests(s, seed)

    async def chat_worker() -> None:
        for req in requests:
            if time.perf_counter() >= end:
                return
            result = await chat(req, min(timeout, deadline - time.perf_counter()))
            run.records.append(("chat", result))
            if result.status in (429, 503):  # a client that honours the server's Retry-After, as OpenAI's SDK
                await anyio.sleep(RETRY_AFTER_S if result.status == 429 else RESTART_WAIT_S)

    async def speech_worker() -> None:
        while time.perf_counter() < end:
            # A dropped upload leaves at a random point of a typical transcription (here: within 3 s).
            hang_up = rng.uniform(0.0, 3.0) if rng.random() < s.disconnect else None
            result = await speech(min(timeout, deadline - time.perf_counter()), hang_up)
            run.records.append(("speech", result))
            if result.status == 503:  # the engine restarts (--isolate): wait as OpenAI's SDK does
                await anyio.sleep(RESTART_WAIT_S)

    async def live_worker() -> None:
        assert live is not None
        while time.perf_counter() < end:
            hang_up = live_rng.uniform(0.05, 0.95) if live_rng.random() < s.disconnect else None
            result = await live(min(timeout, deadline - time.perf_counter()), hang_up)
            run.records.append(("live", result))
            if result.error is not None:  # refused, or ended by a fault: back off before the next session
                await anyio.sleep(RESTART_WAIT_S)

    async def kill_once() -> None:
        assert kill is not None and kill_at is not None
        await anyio.sleep(max(0.0, run.t0 + kill_at * (end - run.t0) - time.perf_counter()))  # the schedule
        run.kill_at = time.perf_counter()
        try:
            run.back_at = await kill(end) or 0.0
        except LookupError as exc:
            run.kill_at, run.kill_error = 0.0, str(exc)

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
        for _ in range(s.live_streams if live is not None else 0):
            tg.start_soon(live_worker)
        if kill is not None and kill_at is not None:
            tg.start_soon(kill_once)
        if burst_size:
            tg.start_soon(burst)
    return run


async def drive_mixed(base: str, s: Scenario, burst: int, deadline: float, options: Any,
                      body: Callable[[Request], dict[str, Any]], server_sid: int | None = None) -> MixedRun:
    """run_mixed against the server at `base`: chat through the streaming client (`body(request)` builds
    each request), transcriptions of `options.audio` (clip_bytes), live sessions of the samples' clips
    (`options.live_seconds` each), and with `options.kill_engine_at` the engine process in the server's
    session (`server_sid`) killed once. Raises nothing."""
    import os
    from pathlib import Path

    from bench.realtime_client import realtime_url, signals
    from bench.serve_client import make_client, stream_chat
    from bench.serve_procs import kill_in_session

    audio = clip_bytes(options.audio)
    samples = os.environ.get("TANDEM_AUDIO_SAMPLES")
    voices = [pcm for pcm, _ in signals(4, options.live_seconds, Path(samples) if samples else None)]
    turn = iter(range(1 << 30))
    async with make_client() as client:

        async def chat(req: Request, timeout: float) -> RequestResult:
            return await stream_chat(client, base + "/v1/chat/completions", body(req), timeout, req.disconnect_after)

        async def speech(timeout: float, hang_up: float | None) -> RequestResult:
            return await transcribe_file(client, base + "/v1/audio/transcriptions", audio, timeout, hang_up)

        async def live(timeout: float, hang_up: float | None) -> RequestResult:
            return await live_session(realtime_url(base), voices[next(turn) % len(voices)], timeout, hang_up)

        async def kill(until: float) -> float | None:
            if server_sid is None or (pid := kill_in_session(server_sid, ENGINE_MARKER)) is None:
                raise LookupError(f"no engine process ({ENGINE_MARKER}) in the server's session")
            print(f"[{time.strftime('%H:%M:%S')}] soak: killed the engine process {pid} (SIGKILL)", file=sys.stderr)
            return await _healthy_again(client, base + "/health", until)

        return await run_mixed(s, chat, speech, burst, options.timeout, deadline, options.seed, live,
                               kill if options.kill_engine_at is not None else None, options.kill_engine_at)


async def _healthy_again(client: httpx.AsyncClient, url: str, until: float) -> float | None:
    """When `url` answers 200 again after it stopped (polled every 0.2 s; the kill may take a moment to be
    noticed, at most 10 s); None when not before `until`. Raises nothing."""
    seen_down = False
    started = time.perf_counter()
    while time.perf_counter() < until:
        try:
            ok = (await client.get(url, timeout=5.0)).status_code == 200
        except httpx.HTTPError:
            ok = False
        seen_down = seen_down or not ok or time.perf_counter() - started > 10.0
        if ok and seen_down:
            return time.perf_counter()
        await anyio.sleep(0.2)  # polling period of a measurement
    return None


def _round(x: float | None) -> float | None:
    return round(x, 1) if x is not None and x == x else None  # NaN (no data) too


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


def _fault_window(run: MixedRun, r: RequestResult) -> str | None:
    """"kill": the request was in flight when the engine process was killed; "restart": it started while the
    engine was down (up to the first healthy /health, or the end); None otherwise."""
    if not run.kill_at:
        return None
    if r.t_start < run.kill_at <= r.t_end:
        return "kill"
    return "restart" if run.kill_at <= r.t_start <= (run.back_at or float("inf")) else None


def summarize_mixed(run: MixedRun) -> dict[str, Any]:
    """Served and refused per kind, errors by kind (and those in flight at the engine kill or sent during
    its restart apart), and the latency of admitted (200, answered in full) chat requests started before the
    burst vs during it. Raises nothing."""
    by_kind: dict[str, dict[str, Any]] = {}
    errors: Counter[str] = Counter()
    at_fault: dict[str, Counter[str]] = {"kill": Counter(), "restart": Counter()}
    samples: dict[str, str] = {}
    unexpected = 0
    for kind, r in run.records:
        row = by_kind.setdefault(kind, {"sent": 0, "served": 0, "disconnected": 0, "refused_429": 0, "failed": 0})
        row["sent"] += 1
        if r.error is None:
            row["disconnected" if r.disconnected else "served"] += 1
        else:
            reason = r.error.split(":")[0]
            errors[reason] += 1
            samples.setdefault(reason, r.error[:200])
            row["refused_429" if reason == "http_429" else "failed"] += 1
            if (window := _fault_window(run, r)) is not None:
                at_fault[window][f"{kind} {reason}"] += 1
            elif reason != "http_429":
                unexpected += 1
    admitted = [(k, r) for k, r in run.records if k in ("chat", "burst") and r.error is None and not r.disconnected]
    live = [r.t_end - r.t_start for k, r in run.records if k == "live" and r.error is None and not r.disconnected]
    before = [r for _, r in admitted if r.t_start < run.burst_start]
    during = [r for _, r in admitted if run.burst_start <= r.t_start <= max(run.burst_end, run.burst_start)]
    return {
        "burst": {"size": run.burst_size, "at_s": round(run.burst_start - run.t0, 1),
                  "lasted_s": round(max(0.0, run.burst_end - run.burst_start), 1)},
        "by_kind": by_kind,
        "errors_by_kind": dict(errors),
        "error_samples": samples,
        # Not 429, not in flight at the kill, not sent while the engine restarted.
        "unexpected_errors": unexpected,
        "kill": {"at_s": round(run.kill_at - run.t0, 1) if run.kill_at else None,
                 "healthy_after_s": round(run.back_at - run.kill_at, 1) if run.kill_at and run.back_at else None,
                 "error": run.kill_error or None,
                 "in_flight_errors": dict(at_fault["kill"]), "restart_errors": dict(at_fault["restart"])},
        "admitted_chat_before_burst": _latency(before),
        "admitted_chat_during_burst": _latency(during),
        "live_session_s": {"n": len(live), "p50": _round(percentile(live, 50)), "max": _round(max(live, default=None))},
        # Every request: kind, start and end (s into the soak), outcome (ok, disconnected or the error's kind).
        "records": [[k, round(r.t_start - run.t0, 2), round(r.t_end - run.t0, 2),
                     r.error.split(":")[0] if r.error else "disconnected" if r.disconnected else "ok"]
                    for k, r in run.records],
        # Streams already running: does the burst slow their tokens down?
        "itl_ms": _itl_by_window([r for _, r in admitted], run.burst_start, max(run.burst_end, run.burst_start)),
    }
