"""/livez: alive while the server runs, loading and restarting included; failing (503) only when the engine
cannot run rows and will not recover by itself; open without an API key. /readyz answers as /health."""

from __future__ import annotations


import anyio
import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.config import ServiceConfig
from service.state import AppState
from tests.service.fake_engine import FakeEngine


async def _until_ready(state: AppState) -> None:
    while not state.ready:
        await anyio.sleep(0)  # a checkpoint: lets the background start run until it reports ready


def test_livez_is_alive_while_the_model_loads_as_health_says_loading() -> None:
    # A livenessProbe on /health restarted a pod during a long first load (503 loading).
    release = anyio.Event()

    async def load(_: ServiceConfig) -> FakeEngine:
        await release.wait()
        return FakeEngine()

    state = AppState(load_engine=load, load_in_background=True, config=ServiceConfig(api_keys=["k"]))
    with TestClient(create_app(state)) as client:
        assert client.get("/health").status_code == 503 and client.get("/readyz").json()["status"] == "loading"
        live = client.get("/livez")  # no key: a kubelet sends none
        assert (live.status_code, live.json()) == (200, {"status": "alive"})
        client.blocking_portal.call(release.set)
        client.blocking_portal.call(_until_ready, state)
        assert client.get("/readyz").json() == {"status": "ok", "model": "fake-model"}
        assert (client.get("/livez").status_code, client.head("/livez").status_code) == (200, 200)
        assert client.get("/v1/models").status_code == 401  # the other routes still need the key


def test_livez_fails_while_the_engine_cannot_run_rows(fake_engine: FakeEngine) -> None:
    # Readiness takes a failing pod out of the Service, so no request comes to end its run of failed steps: only a
    # restart does.
    fake_engine.failing = "RuntimeError: device lost"
    with TestClient(create_app(AppState(engine=fake_engine, config=ServiceConfig(api_keys=["k"])))) as client:
        live = client.get("/livez")
        assert (live.status_code, live.json()) == (503, {"status": "failing", "error": "RuntimeError: device lost"})
        assert client.get("/readyz").json()["status"] == "failing"
        fake_engine.failing = None  # a step landed: alive again
        assert client.get("/livez").json() == {"status": "alive"}


@pytest.mark.parametrize("state,status", [("restarting", 200), ("failed", 503)])
def test_livez_under_isolate_fails_only_once_the_engine_process_stopped_for_good(
        fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch, state: str, status: int) -> None:
    from service.isolate.remote import RemoteEngine

    remote = RemoteEngine(ServiceConfig())
    remote._state = state  # restarting: a new engine process loads; failed: a crash loop, not restarted again
    remote._failure = "The engine process stopped: it crashed 5 times in 60 s."
    monkeypatch.setattr(fake_engine, "health", remote.health)
    with TestClient(create_app(AppState(engine=fake_engine))) as client:
        assert client.get("/health").status_code == 503
        assert client.get("/livez").status_code == status


def test_livez_is_alive_while_the_server_drains(fake_engine: FakeEngine) -> None:
    state = AppState(engine=fake_engine)
    with TestClient(create_app(state)) as client:
        state.draining = True
        assert client.get("/health").json()["status"] == "stopping"
        assert client.get("/livez").json() == {"status": "alive"}
