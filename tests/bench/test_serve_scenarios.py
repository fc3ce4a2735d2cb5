"""Scenario loops: Poisson schedule rate, closed-loop concurrency, deadlines; scenario selection."""

from __future__ import annotations

import statistics

import anyio
import pytest

from bench.serve_scenarios import (PROFILES, SCENARIOS, Request, poisson_offsets, run_scenario, scenario_requests,
                                  scenarios_for)
from bench.serve_stats import RequestResult, summarize


def test_poisson_schedule_has_the_asked_rate() -> None:
    offsets = poisson_offsets(20_000, 8.0, seed=3)
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert offsets[0] == 0.0 and all(g > 0 for g in gaps)
    assert (len(offsets) - 1) / offsets[-1] == pytest.approx(8.0, rel=0.03)
    # exponential gaps: standard deviation equals the mean
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, rel=0.05)
    assert poisson_offsets(50, 8.0, seed=3) == offsets[:50]  # seeded: both servers get the same arrivals
    with pytest.raises(ValueError):
        poisson_offsets(3, 0.0, seed=0)


class FakeServer:
    """A send() that yields to the loop a few times and records how many requests were in flight."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0
        self.seen: list[Request] = []

    async def send(self, req: Request, timeout: float) -> RequestResult:
        self.seen.append(req)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        res = RequestResult(t_start=0.0)
        for i in range(3):
            await anyio.lowlevel.checkpoint()
            res.chunk_times.append(float(i))
            res.chunk_texts.append("tok")
        res.completion_tokens = 3
        self.in_flight -= 1
        res.t_end = 1.0
        return res


@pytest.mark.anyio
async def test_closed_loop_keeps_n_streams_and_answers_every_request() -> None:
    fake = FakeServer()
    s = SCENARIOS["c8"]
    prepared: list[int] = []
    results, _ = await run_scenario(s, fake.send, timeout=5.0, deadline=float("inf"),
                                    prepare=lambda r: prepared.append(r.index))
    assert len(results) == s.requests and all(r.ok for r in results)
    assert fake.most == s.concurrency
    assert sorted(prepared) == list(range(s.requests))
    assert {r.prompt_tokens for r in fake.seen} == {128} and {r.max_tokens for r in fake.seen} == {128}


@pytest.mark.anyio
async def test_past_deadline_nothing_is_sent_and_all_count_as_failed() -> None:
    fake = FakeServer()
    results, _ = await run_scenario(SCENARIOS["c1"], fake.send, timeout=5.0, deadline=0.0)
    assert fake.seen == [] and all(r.not_sent for r in results)
    summary = summarize(results, 1.0)
    assert summary["failed"] == SCENARIOS["c1"].requests and summary["failed_reasons"] == {"not_sent": 32}


def test_poisson_prompts_are_mixed_and_soak_disconnects_some() -> None:
    s = SCENARIOS["poisson8"]
    assert s.prompt_tokens == (128, 2048) and s.rate == 8.0 and s.requests == 64

    lengths = [r.prompt_tokens for r in scenario_requests(s, 0)]
    assert min(lengths) >= 128 and max(lengths) <= 2048 and len(set(lengths)) > 50
    soak = [r for _, r in zip(range(2000), scenario_requests(SCENARIOS["soak"], 0))]
    cut = sum(r.disconnect_after is not None for r in soak) / len(soak)
    assert cut == pytest.approx(0.10, abs=0.03)


def test_profiles_and_overrides() -> None:
    got = {s.name: s for s in scenarios_for(["c1", "c8", "poisson8", "soak"], "cpu", {"c8": 5}, 16, None, 0.5, 2)}
    assert got["c1"].requests == PROFILES["cpu"]["c1"] and got["c8"].requests == 5
    assert got["c1"].max_tokens == (16, 16)
    assert got["poisson8"].prompt_tokens == (128, 2048)  # a mixed range is not overridden by --prompt-tokens
    assert got["soak"].minutes == 0.5 and got["soak"].concurrency == 2
    with pytest.raises(KeyError):
        scenarios_for(["c2"], "full", {}, None, None, None)
