"""/health's view of the engine: failing steps, and a stuck engine (rows waiting, no step landing)."""

from __future__ import annotations

import time
from typing import Any

import pytest

import engine.health as health_module
from engine.contracts import GenerationRequest
from engine.health import STALL_SECONDS, StepHealth


def _at(monkeypatch: pytest.MonkeyPatch, moment: float) -> None:
    monkeypatch.setattr(health_module.time, "monotonic", lambda: moment)


def test_rows_waiting_with_no_step_landing_is_a_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.monotonic()
    _at(monkeypatch, now)
    health = StepHealth()
    _at(monkeypatch, now + STALL_SECONDS + 5)
    assert health.stalled(waiting=False) is None  # idle is not stuck
    assert health.stalled(waiting=True) == pytest.approx(STALL_SECONDS + 5)
    health.succeeded()  # a step landed
    assert health.stalled(waiting=True) is None
    health.waiting_from_idle()
    _at(monkeypatch, now + 2 * STALL_SECONDS)
    assert health.stalled(waiting=True) is None  # counted from when the rows began to wait


@pytest.mark.anyio
async def test_an_engine_whose_steps_stop_landing_reports_it(tiny_loaded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A hung device left /health at 200 ok while every stream waited forever. Here the engine is not served: its
    # row waits as behind a step that never lands.
    from engine.runtime import Engine

    engine = Engine(tiny_loaded)
    try:
        stream = engine.submit(GenerationRequest([5, 6, 7], max_tokens=2))
        assert engine.health() == {"ok": True}
        _at(monkeypatch, time.monotonic() + STALL_SECONDS + 1)
        health = engine.health()
        assert health["ok"] is False and "no engine step has finished" in health["error"], health
        await stream.aclose()
    finally:
        engine.close()
