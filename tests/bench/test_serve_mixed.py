"""The mixed soak's loop and summary: chat and speech clients in closed loops, one burst past the queue
bound, errors by kind, and admitted latency before vs during the burst."""

from __future__ import annotations

import time

import anyio
import pytest

from bench.serve_mixed import clip_bytes, run_mixed, summarize_mixed
from bench.serve_scenarios import SCENARIOS, Request, scenarios_for
from bench.serve_stats import RequestResult


class Admission:
    """A server with room for `room` requests at once: the rest are refused with a 429."""

    def __init__(self, room: int) -> None:
        self.room, self.running, self.kinds = room, 0, []

    async def chat(self, req: Request, timeout: float) -> RequestResult:
        res = RequestResult(t_start=time.perf_counter())
        if self.running >= self.room:
            res.error, res.status = "http_429: queue_full", 429
        else:
            self.running += 1
            for i in range(3):
                await anyio.lowlevel.checkpoint()
                res.chunk_times.append(time.perf_counter())
            self.running -= 1
        res.t_end = time.perf_counter()
        return res

    async def speech(self, timeout: float, hang_up: float | None) -> RequestResult:
        res = RequestResult(t_start=time.perf_counter())
        await anyio.lowlevel.checkpoint()
        res.disconnected = hang_up is not None
        res.t_end = time.perf_counter()
        return res


@pytest.mark.anyio
async def test_the_burst_goes_out_once_and_only_refusals_count_as_expected() -> None:
    scenario = scenarios_for(["mixed"], "full", {}, None, None, soak_minutes=0.002, soak_streams=2)[0]
    server = Admission(room=4)
    run = await run_mixed(scenario, server.chat, server.speech, burst_size=12, timeout=5, deadline=time.perf_counter() + 30)
    summary = summarize_mixed(run)
    kinds = summary["by_kind"]
    assert kinds["burst"]["sent"] == 12 and kinds["burst"]["refused_429"] >= 8
    assert kinds["chat"]["sent"] > 0 and kinds["speech"]["sent"] > 0
    assert summary["unexpected_errors"] == 0 and set(summary["errors_by_kind"]) <= {"http_429"}
    assert summary["admitted_chat_during_burst"]["n"] >= 1 and summary["admitted_chat_before_burst"]["n"] >= 1
    assert summary["itl_ms"]["before_burst"]["n"] + summary["itl_ms"]["during_burst"]["n"] > 0


def test_the_mixed_scenario_and_its_audio() -> None:
    mixed = SCENARIOS["mixed"]
    assert mixed.kind == "mixed" and mixed.speech_streams >= 1 and mixed.disconnect == 0.1
    assert "3 x --max-queued" in mixed.describe()
    assert clip_bytes(None)[:4] == b"RIFF"
