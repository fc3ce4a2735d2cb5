"""A short chat request's time to first token while a long prompt is being read (head-of-line blocking), against
a running server: one ~N-word prompt, then after `--delay` s a short one; prints both TTFTs.

    python -m bench.short_behind_long --server http://127.0.0.1:8080 --words 6000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import httpx

__all__ = ["main"]


async def _ttft(base: str, model: str, content: str, t0: float) -> float:
    body = {"model": model, "stream": True, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": content}]}
    async with httpx.AsyncClient(timeout=None) as c, c.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {") and json.loads(line[6:]).get("choices"):
                return time.monotonic() - t0
    raise RuntimeError("no token came back")


async def _run(base: str, words: int, delay: float) -> dict[str, float]:
    async with httpx.AsyncClient() as c:
        model = (await c.get(f"{base}/v1/models")).json()["data"][0]["id"]
    rng = random.Random(7)
    long = " ".join(rng.choice(["river", "stone", "lantern", "harbor", "meadow", "copper", "signal"])
                    for _ in range(words))
    t0 = time.monotonic()
    first = asyncio.create_task(_ttft(base, model, f"{long}\nSummarise.", t0))
    await asyncio.sleep(delay)  # the long prompt is being read by now
    short = await _ttft(base, model, "Say hi.", time.monotonic())
    return {"short_ttft_s": round(short, 3), "long_ttft_s": round(await first, 3)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.short_behind_long", description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default="http://127.0.0.1:8080")
    p.add_argument("--words", type=int, default=6000)
    p.add_argument("--delay", type=float, default=1.0)
    args = p.parse_args(argv)
    print(json.dumps(asyncio.run(_run(args.server.rstrip("/"), args.words, args.delay))))


if __name__ == "__main__":
    main()
