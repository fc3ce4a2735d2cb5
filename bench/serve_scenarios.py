"""The serving scenarios (names are stable: issue 7's table) and the loops that drive them.

closed: N streams, each sends its next request when the last one ended, until M requests were sent.
poisson: open loop, requests start at Poisson arrival times whatever the server does.
soak: closed loop for N minutes with mixed prompt/output lengths; a fraction of clients hang up mid-stream.
mixed: a soak of chat and file transcription with a burst past the admission bound (bench/serve_mixed.py).
Every loop has a deadline: requests not started by then are `not_sent`, running ones time out at it.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterator

import anyio

from bench.serve_stats import RequestResult

__all__ = ["Scenario", "SCENARIOS", "DEFAULT_SET", "PROFILES", "Request", "scenario_requests", "poisson_offsets",
           "run_scenario", "scenarios_for"]


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str  # closed | poisson | soak
    requests: int = 0
    concurrency: int = 1
    rate: float = 0.0  # poisson: arrivals per second
    prompt_tokens: tuple[int, int] = (128, 128)  # uniform in [lo, hi]
    max_tokens: tuple[int, int] = (128, 128)
    minutes: float = 0.0  # soak
    disconnect: float = 0.0  # soak: fraction of requests whose client hangs up early
    speech_streams: int = 0  # mixed: clients uploading files to transcribe, in closed loops
    live_streams: int = 0  # mixed: clients running live Realtime transcription sessions, one after another
    burst_at: float = 0.5  # mixed: when the burst of 3 x --max-queued chat requests goes out (fraction of the soak)

    def describe(self) -> str:
        p = f"{self.prompt_tokens[0]}" if self.prompt_tokens[0] == self.prompt_tokens[1] else "%d–%d" % self.prompt_tokens
        o = f"{self.max_tokens[0]}" if self.max_tokens[0] == self.max_tokens[1] else "%d–%d" % self.max_tokens
        if self.kind == "closed":
            return f"{self.concurrency} stream{'s' if self.concurrency > 1 else ''}, {self.requests} requests, prompt {p}, max_tokens {o}"
        if self.kind == "poisson":
            return f"Poisson {self.rate:g} req/s, {self.requests} requests, prompt {p}, max_tokens {o}"
        if self.kind == "mixed":
            return (f"mixed soak {self.minutes:g} min, {self.concurrency} chat streams + {self.speech_streams} "
                    f"transcription clients + {self.live_streams} live session clients, prompt {p}, max_tokens {o}, "
                    f"{self.disconnect:.0%} disconnects, a burst "
                    f"of 3 x --max-queued chat requests at {self.burst_at:.0%}")
        return (f"soak {self.minutes:g} min, {self.concurrency} streams, prompt {p}, max_tokens {o}, "
                f"{self.disconnect:.0%} disconnects")


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("c1", "closed", requests=32, concurrency=1),
        Scenario("c8", "closed", requests=64, concurrency=8),
        Scenario("c64", "closed", requests=128, concurrency=64),
        Scenario("poisson8", "poisson", requests=64, rate=8.0, prompt_tokens=(128, 2048)),
        Scenario("c128", "closed", requests=256, concurrency=128),
        Scenario("soak", "soak", concurrency=16, minutes=10.0, prompt_tokens=(128, 2048), max_tokens=(16, 256),
                 disconnect=0.1),
        Scenario("mixed", "mixed", concurrency=4, speech_streams=1, live_streams=1, minutes=4.0, prompt_tokens=(64, 512),
                 max_tokens=(16, 96), disconnect=0.1),
    )
}
DEFAULT_SET = ("c1", "c8", "c64", "poisson8", "c128")
# Request counts per profile; `quick` fits ours + the peer in one 10-minute H200 call (bench/gpu/serve_h200.sh).
PROFILES: dict[str, dict[str, int]] = {
    "full": {},
    "quick": {"c1": 16},
    "cpu": {"c1": 4, "c8": 16, "c64": 64, "poisson8": 16, "c128": 128},
}


def scenarios_for(names: list[str], profile: str, requests: dict[str, int], max_tokens: int | None,
                  prompt_tokens: int | None, soak_minutes: float | None, soak_streams: int | None = None,
                  soak_prompts: tuple[int, int] | None = None) -> list[Scenario]:
    """The named scenarios with the profile's and the command line's overrides. Raises KeyError for a
    name that is not a scenario or profile."""
    out = []
    counts = PROFILES[profile] | requests
    for name in names:
        s = SCENARIOS[name]
        change: dict[str, object] = {}
        if name in counts:
            change["requests"] = counts[name]
        if max_tokens is not None and s.max_tokens[0] == s.max_tokens[1]:
            change["max_tokens"] = (max_tokens, max_tokens)
        if prompt_tokens is not None and s.prompt_tokens[0] == s.prompt_tokens[1]:
            change["prompt_tokens"] = (prompt_tokens, prompt_tokens)
        if soak_minutes is not None and s.kind in ("soak", "mixed"):
            change["minutes"] = soak_minutes
        if soak_streams is not None and s.kind in ("soak", "mixed"):
            change["concurrency"] = soak_streams
        if soak_prompts is not None and s.kind in ("soak", "mixed"):
            change["prompt_tokens"] = soak_prompts
        out.append(dataclasses.replace(s, **change))
    return out


@dataclass(frozen=True)
class Request:
    index: int
    prompt_tokens: int
    max_tokens: int
    disconnect_after: int | None = None


def poisson_offsets(n: int, rate: float, seed: int) -> list[float]:
    """Start times (s) of n Poisson arrivals at `rate` per second: first at 0, then exponential gaps.

    Raises ValueError for a rate that is not positive."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        if i:
            t += rng.expovariate(rate)
        out.append(t)
    return out


def scenario_requests(s: Scenario, seed: int) -> Iterator[Request]:
    """The scenario's requests, seeded (endless for a soak)."""
    rng = random.Random(f"{seed}/{s.name}")
    for i in itertools.count() if s.kind in ("soak", "mixed") else range(s.requests):
        cut = rng.randint(0, 8) if rng.random() < s.disconnect else None
        yield Request(i, rng.randint(*s.prompt_tokens), rng.randint(*s.max_tokens), cut)


Send = Callable[[Request, float], Awaitable[RequestResult]]  # (request, timeout s) → result


async def run_scenario(s: Scenario, send: Send, timeout: float, deadline: float, seed: int = 0,
                       prepare: Callable[[Request], None] | None = None) -> tuple[list[RequestResult], float]:
    """Drive scenario `s` through `send`; return (results in request order, wall seconds). `deadline` is a
    time.perf_counter() value after which nothing starts and running requests time out. `prepare` sees
    every request of a finite scenario before the clock starts (to build its prompt). Raises nothing."""
    results: dict[int, RequestResult] = {}
    cursor = scenario_requests(s, seed)
    if s.kind != "soak":
        pending = list(cursor)
        for req in pending:
            if prepare is not None:
                prepare(req)
        cursor = iter(pending)
    t0 = time.perf_counter()
    # A soak starts nothing after its end; requests running then finish (bounded by `deadline`).
    soak_end = min(deadline, t0 + s.minutes * 60.0)

    async def one(req: Request) -> None:
        left = deadline - time.perf_counter()
        if left <= 0:
            results[req.index] = RequestResult(t_start=time.perf_counter(), t_end=time.perf_counter(), not_sent=True)
            return
        results[req.index] = await send(req, min(timeout, left))

    async def worker() -> None:
        for req in cursor:
            if s.kind == "soak" and time.perf_counter() >= soak_end:
                return  # a soak ends on time: no request counts as unsent
            await one(req)

    async with anyio.create_task_group() as tg:
        if s.kind == "poisson":
            for req, offset in zip(cursor, poisson_offsets(s.requests, s.rate, seed)):
                # an open-loop schedule: wait for the arrival time, not for any earlier request
                await anyio.sleep(max(0.0, t0 + offset - time.perf_counter()))
                tg.start_soon(one, req)
        else:
            for _ in range(s.concurrency):
                tg.start_soon(worker)
    wall = max((r.t_end for r in results.values()), default=t0) - t0
    return [results[i] for i in sorted(results)], wall
