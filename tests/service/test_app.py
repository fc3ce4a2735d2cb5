"""The app factory and lifespan: the engine loop runs for the app's life and stops with it."""

from __future__ import annotations

import contextlib
from typing import AsyncIterator

import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.state import AppState
from service.config import ServiceConfig
from tests.service.fake_engine import FakeEngine


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def test_a_failing_hook_fails_startup_with_its_own_error_only() -> None:
    from engine.runtime import Engine

    @contextlib.asynccontextmanager
    async def broken(_: AppState) -> AsyncIterator[None]:
        raise LookupError("hook failed")
        yield

    engine = Engine(None)
    with pytest.raises(BaseException) as failure:
        with TestClient(create_app(AppState(engine=engine, lifespan_hooks=[broken]))):
            pass
    assert [type(e) for e in _leaves(failure.value)] == [LookupError]  # not also "engine is closed"


def test_hooks_run_inside_the_engine_lifetime() -> None:
    engine = FakeEngine()
    seen: list[str] = []

    @contextlib.asynccontextmanager
    async def hook(state: AppState) -> AsyncIterator[None]:
        seen.append(f"enter serving={engine.serving} task_group={state.task_group is not None}")
        yield
        seen.append(f"exit serving={engine.serving}")

    with TestClient(create_app(AppState(engine=engine, lifespan_hooks=[hook]))) as client:
        assert client.get("/health").status_code == 200
    assert seen == ["enter serving=True task_group=True", "exit serving=True"]
    assert not engine.serving


def test_load_engine_runs_at_startup() -> None:
    built: list[ServiceConfig] = []

    async def load(config: ServiceConfig) -> FakeEngine:
        built.append(config)
        return FakeEngine()

    state = AppState(config=ServiceConfig(model="m"), load_engine=load)
    app = create_app(state)
    assert state.engine is None
    with TestClient(app) as client:
        assert client.get("/v1/models").json()["data"][0]["id"] == "fake-model"
        assert client.post("/v1/completions", json={"model": "m", "prompt": "a"}).status_code == 200
    assert [c.model for c in built] == ["m"]


def test_the_app_adds_no_logging_handlers_of_its_own() -> None:
    # Litestar's default logging config starts a queue listener thread bound to the stderr of the moment (a test's
    # capture, closed when a later test's record arrived: "I/O operation on closed file" from its _monitor thread).
    import logging

    from service.app import create_app
    from service.state import AppState

    before = {name: list(logging.getLogger(name).handlers) for name in ("", "litestar")}
    create_app(AppState())
    assert {name: list(logging.getLogger(name).handlers) for name in ("", "litestar")} == before
