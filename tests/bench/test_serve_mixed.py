"""The mixed soak's loop and summary: chat, speech and live-session clients in closed loops, one burst past
the queue bound, the engine process killed once, errors by kind (those at the kill apart), and admitted
latency before vs during the burst; a live session's outcome by kind against a small Realtime socket."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from bench.serve_mixed import MixedRun, clip_bytes, live_session, run_mixed, summarize_mixed
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


def result(t_start: float, t_end: float, error: str | None = None) -> RequestResult:
    return RequestResult(t_start=t_start, t_end=t_end, error=error,
                         status=int(error[5:8]) if error and error.startswith("http_") else None)


def test_errors_at_the_engine_kill_are_told_apart_from_the_unexpected_ones() -> None:
    run = MixedRun(t0=0.0, burst_start=50.0, burst_end=60.0, burst_size=24, kill_at=100.0, back_at=110.0)
    run.records = [
        ("chat", result(1, 9)),
        ("chat", result(95, 100.5, "error_event: the engine process exited")),  # in flight at the kill
        ("live", result(90, 101, "error_event: engine_restarting")),  # in flight at the kill
        ("speech", result(101, 101.1, "http_503: engine_restarting")),  # sent while it restarted
        ("burst", result(50, 50.1, "http_429: queue_full")),
        ("chat", result(120, 121, "http_500: something else")),  # after the restart: unexpected
        ("live", result(130, 140)),
        ("live", result(2, 40)),  # served before the burst: a session, not an admitted chat request
    ]
    summary = summarize_mixed(run)
    kill = summary["kill"]
    assert kill["at_s"] == 100.0 and kill["healthy_after_s"] == 10.0
    assert kill["in_flight_errors"] == {"chat error_event": 1, "live error_event": 1}
    assert kill["restart_errors"] == {"speech http_503": 1}
    assert summary["unexpected_errors"] == 1 and summary["errors_by_kind"]["http_500"] == 1
    assert summary["by_kind"]["live"] == {"sent": 3, "served": 2, "disconnected": 0, "refused_429": 0, "failed": 1}
    assert summary["admitted_chat_before_burst"]["n"] == 1 and summary["live_session_s"] == {"n": 2, "p50": 24.0,
                                                                                              "max": 38.0}
    assert summary["records"][1] == ["chat", 95.0, 100.5, "error_event"]
    assert summary["error_samples"]["http_500"] == "http_500: something else"


def test_without_a_kill_every_error_but_429_is_unexpected() -> None:
    run = MixedRun(t0=0.0, burst_start=50.0, burst_end=60.0)
    run.records = [("chat", result(95, 100.5, "error_event: x")), ("burst", result(50, 51, "http_429: full"))]
    summary = summarize_mixed(run)
    assert summary["unexpected_errors"] == 1 and summary["kill"]["at_s"] is None


@pytest.mark.anyio
async def test_live_clients_run_beside_the_others_and_the_engine_is_killed_once() -> None:
    scenario = scenarios_for(["mixed"], "full", {}, None, None, soak_minutes=0.003, soak_streams=1)[0]
    assert scenario.live_streams == 1
    server = Admission(room=4)
    kills: list[float] = []

    async def live(timeout: float, hang_up: float | None) -> RequestResult:
        return await server.speech(timeout, hang_up)

    async def kill(until: float) -> float | None:
        kills.append(time.perf_counter())
        await anyio.lowlevel.checkpoint()
        return time.perf_counter()

    run = await run_mixed(scenario, server.chat, server.speech, burst_size=2, timeout=5,
                          deadline=time.perf_counter() + 30, live=live, kill=kill, kill_at=0.5)
    assert len(kills) == 1 and run.kill_at <= kills[0] <= run.back_at
    assert any(kind == "live" for kind, _ in run.records)

    async def nothing_to_kill(until: float) -> float | None:
        raise LookupError("no engine process")

    run = await run_mixed(scenario, server.chat, server.speech, burst_size=2, timeout=5,
                          deadline=time.perf_counter() + 30, live=live, kill=nothing_to_kill, kill_at=0.5)
    summary = summarize_mixed(run)
    assert summary["kill"]["at_s"] is None and summary["kill"]["error"] == "no engine process"


class RealtimeServer:
    """A Realtime transcription socket that answers the client's final commit (`answer`), or refuses the
    session with an error event and close 1013 (`refuse`), or closes with 1011 mid-session (`crash`)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    async def handle(self, ws: Any) -> None:
        import json

        if self.mode == "refuse":
            await ws.send(json.dumps({"type": "error", "error": {"code": "engine_restarting", "message": "later"}}))
            await ws.close(1013)
            return
        await ws.send(json.dumps({"type": "session.created"}))
        async for raw in ws:
            event = json.loads(raw)
            if self.mode == "crash":
                await ws.close(1011)
                return
            if event["type"] == "input_audio_buffer.commit":
                await ws.send(json.dumps({"type": "input_audio_buffer.committed", "item_id": "i1",
                                          "client_event_id": event.get("event_id")}))
                await ws.send(json.dumps({"type": "conversation.item.input_audio_transcription.completed",
                                          "item_id": "i1", "transcript": "hello"}))


@pytest.mark.anyio
@pytest.mark.parametrize("mode,hang_up,expect", [
    ("answer", None, "served"), ("answer", 0.3, "disconnected"), ("refuse", None, "error_event"),
    ("crash", None, "closed")])
async def test_a_live_session_is_served_dropped_or_failed_by_kind(mode: str, hang_up: float | None,
                                                                  expect: str) -> None:
    import numpy as np
    from websockets.asyncio.server import serve

    async with serve(RealtimeServer(mode).handle, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        res = await live_session(f"ws://127.0.0.1:{port}/v1/realtime", np.zeros(4800, np.float32), timeout=30,
                                 hang_up_at=hang_up)
    outcome = ("disconnected" if res.disconnected else "served") if res.error is None else res.error.split(":")[0]
    assert outcome == expect, res.error
    if expect == "served":
        assert len(res.chunk_times) == 1  # the final transcript
