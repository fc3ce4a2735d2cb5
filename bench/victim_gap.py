"""One stream's token gaps while other clients come and go: 20 short requests that drop after 5 events
(`joins`), or 6 distinct ~3,600-token prompts dropped mid-prefill after 1.5 s (`prefill`), against a running server.

    python -m bench.victim_gap --server http://127.0.0.1:8080 prefill

Prints when each phase ran and every gap over 0.3 s (the stream's end time, the gap). Run it on a fresh server
for the first-prompts-after-a-start case (the pacer has measured nothing yet).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import httpx

__all__ = ["main"]


async def _victim(base: str, model: str, n: int, t0: float) -> list[float]:
    times: list[float] = []
    body = {"model": model, "stream": True, "max_tokens": n, "temperature": 0.7, "seed": 1,
            "messages": [{"role": "user", "content": "Write a long story about a dragon."}]}
    async with httpx.AsyncClient(timeout=None) as c, c.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {") and json.loads(line[6:]).get("choices"):
                times.append(time.monotonic() - t0)
    return times


async def _drop_after(base: str, model: str, events: int) -> None:
    body = {"model": model, "stream": True, "max_tokens": 500, "messages": [{"role": "user", "content": "Tell me a long story."}]}
    async with httpx.AsyncClient(timeout=60) as c, c.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
        seen = 0
        async for line in r.aiter_lines():
            seen += line.startswith("data: ")
            if seen >= events:
                return


async def _drop_mid_prefill(base: str, model: str, text: str) -> None:
    body = {"model": model, "stream": True, "max_tokens": 50, "messages": [{"role": "user", "content": text}]}
    async with httpx.AsyncClient(timeout=1.5) as c:
        try:
            await c.post(f"{base}/v1/chat/completions", json=body)
        except httpx.HTTPError:  # the point: the client gives up mid-prefill
            pass


async def _run(args: argparse.Namespace) -> None:
    t0, marks = time.monotonic(), []
    victim = asyncio.create_task(_victim(args.server, args.model, args.tokens, t0))
    await asyncio.sleep(3)  # the victim streams alone first
    marks.append((round(time.monotonic() - t0, 2), f"{args.scenario} start"))
    if args.scenario == "joins":
        await asyncio.gather(*[_drop_after(args.server, args.model, 5) for _ in range(20)])
    else:
        run = random.randrange(10**9)  # distinct prompts: no prefix-cache hits across runs or requests
        await asyncio.gather(*[_drop_mid_prefill(args.server, args.model, f"run {run} part {k}: " + "lorem ipsum dolor " * 600)
                               for k in range(6)])
    marks.append((round(time.monotonic() - t0, 2), f"{args.scenario} dropped"))
    times = await victim
    gaps = [(round(b, 2), round(b - a, 3)) for a, b in zip(times, times[1:])]
    print("phases", marks)
    print("gaps over 0.3 s (end, gap)", [g for g in gaps if g[1] > 0.3])
    if gaps:
        ordered = sorted(g for _, g in gaps)
        print(f"events {len(times)}  max gap {ordered[-1]:.3f} s  p50 {ordered[len(ordered) // 2]:.3f} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.victim_gap", description=__doc__.split("\n\n")[0])
    p.add_argument("scenario", choices=["joins", "prefill"])
    p.add_argument("--server", default="http://127.0.0.1:8080")
    p.add_argument("--model", default="", help="model id (default: the served one)")
    p.add_argument("--tokens", type=int, default=300, help="the victim stream's max_tokens")
    asyncio.run(_run(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
