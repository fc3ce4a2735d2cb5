"""Concurrent OpenAI-style streaming load: TTFT, inter-token latency, aggregate tokens/s."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field

import anyio
import httpx

__all__ = ["StreamResult", "LoadResult", "stream_once", "run_load", "wait_ready"]


@dataclass
class StreamResult:
    ttft: float
    total: float
    tokens: int
    token_times: list[float] = field(default_factory=list)

    @property
    def itl(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def decode_tps(self) -> float:
        """Tokens after the first divided by the time after the first token (pure decode speed)."""
        if self.tokens < 2 or len(self.token_times) < 2:
            return 0.0
        return (self.tokens - 1) / max(self.token_times[-1] - self.token_times[0], 1e-9)


@dataclass
class LoadResult:
    concurrency: int
    streams: list[StreamResult]
    wall: float

    def summary(self) -> dict:
        ttfts = sorted(s.ttft for s in self.streams)
        itls = sorted(x for s in self.streams for x in s.itl)
        tokens = sum(s.tokens for s in self.streams)

        def pct(xs: list[float], p: float) -> float:
            return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")

        return {
            "concurrency": self.concurrency,
            "tokens": tokens,
            "ttft_p50_s": round(pct(ttfts, 50), 3),
            "ttft_p99_s": round(pct(ttfts, 99), 3),
            "itl_p50_ms": round(pct(itls, 50) * 1000, 1),
            "itl_p99_ms": round(pct(itls, 99) * 1000, 1),
            "aggregate_tok_s": round(tokens / self.wall, 2),
            "per_stream_decode_tok_s": round(statistics.mean(s.decode_tps for s in self.streams), 2),
        }


async def stream_once(client: httpx.AsyncClient, url: str, body: dict) -> StreamResult:
    """POST a streaming chat request and time every content chunk (one chunk ≈ one token for both servers)."""
    t0 = time.perf_counter()
    times: list[float] = []
    usage_tokens = None
    async with client.stream("POST", url, json=body, timeout=600) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data.strip() == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                usage_tokens = chunk["usage"].get("completion_tokens")
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
                    times.append(time.perf_counter())
    end = time.perf_counter()
    ttft = (times[0] - t0) if times else end - t0
    tokens = usage_tokens if usage_tokens is not None else len(times)
    return StreamResult(ttft=ttft, total=end - t0, tokens=tokens, token_times=times)


async def run_load(base_url: str, model: str, prompts: list[str], max_tokens: int) -> LoadResult:
    """Send all prompts at once as streaming chat requests; wall time covers all of them."""
    url = base_url.rstrip("/") + "/v1/chat/completions"
    results: list[StreamResult] = []
    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()

        async def one(prompt: str) -> None:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            results.append(await stream_once(client, url, body))

        async with anyio.create_task_group() as tg:
            for p in prompts:
                tg.start_soon(one, p)
        wall = time.perf_counter() - t0
    return LoadResult(concurrency=len(prompts), streams=results, wall=wall)


def wait_ready(base_url: str, process, timeout: float = 300.0) -> None:
    """Poll /v1/models until the server answers (bounded); raise if the process died or time ran out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            if httpx.get(base_url.rstrip("/") + "/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)  # polling a child process start, not synchronising our own code
    raise TimeoutError(f"{base_url} not ready after {timeout} s")
