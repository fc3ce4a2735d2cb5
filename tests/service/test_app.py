"""The app factory and lifespan: the engine loop runs for the app's life and stops with it."""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator

import anyio
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


class _FailingEngine(FakeEngine):
    """A fake engine whose loop fails when the test says, as a step error the loop could not contain would."""

    async def serve(self) -> None:
        import anyio

        self.fail = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(super().serve)
            await self.fail.wait()
            raise OverflowError("cannot convert float infinity to integer")


def test_a_failure_while_serving_is_not_called_a_startup_failure() -> None:
    import anyio

    seen: list[tuple[type[BaseException], bool]] = []
    told = anyio.Event()
    engine = _FailingEngine()

    def fatal(exc: BaseException, served: bool) -> None:
        seen.append((type(_leaves(exc)[0]), served))
        told.set()

    async def load(_: ServiceConfig) -> FakeEngine:
        return engine

    state = AppState(load_engine=load, load_in_background=True, on_fatal=fatal)
    with TestClient(create_app(state)) as client:
        client.blocking_portal.call(_until_ready, state)
        client.blocking_portal.call(engine.fail.set)
        client.blocking_portal.call(told.wait)
    # The worker's handler exits to be respawned (service/app.py _exit_fatal), not "could not start".
    assert seen == [(OverflowError, True)]


def test_a_model_that_does_not_load_is_a_startup_failure() -> None:
    import anyio

    seen: list[tuple[type[BaseException], bool]] = []
    told = anyio.Event()

    def fatal(exc: BaseException, served: bool) -> None:
        seen.append((type(_leaves(exc)[0]), served))
        told.set()

    async def load(_: ServiceConfig) -> FakeEngine:
        raise FileNotFoundError("no such model")

    with TestClient(create_app(AppState(load_engine=load, load_in_background=True, on_fatal=fatal))) as client:
        client.blocking_portal.call(told.wait)
    assert seen == [(FileNotFoundError, False)]


async def _until_ready(state: AppState) -> None:
    import anyio

    while not state.ready:
        await anyio.sleep(0)  # a checkpoint: lets the background start run until it reports ready


def test_the_workers_fatal_handler_respawns_a_serving_failure_and_names_a_startup_ones_cause(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from service import app as app_module
    from service.process.restarts import EXIT_STARTUP_FAILED, RestartPolicy

    codes: list[int] = []
    monkeypatch.setattr(app_module.os, "_exit", codes.append)
    caplog.set_level(logging.ERROR, logger="tandem")
    app_module._exit_fatal(OverflowError("inf"), True)
    app_module._exit_fatal(ExceptionGroup("unhandled errors in a TaskGroup", [KeyError("hook")]), False)
    assert codes[1] == EXIT_STARTUP_FAILED and RestartPolicy().decide(codes[0], 0.0).respawn
    assert "OverflowError: inf" in caplog.text and "KeyError: 'hook'" in caplog.text  # tracebacks, causes named


def test_the_startup_line_names_the_context_a_request_can_use_when_the_budget_holds_less() -> None:
    from service.app import _context

    engine = FakeEngine(context_length=8192)
    assert _context(engine) == "8192 tokens"
    engine.budget_fits = 1279
    assert _context(engine) == "8192 tokens; 1279 fit the memory budget for one request"


@pytest.mark.anyio
async def test_a_worker_stopped_while_its_models_load_exits_as_stopped_not_as_failed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A Ctrl-C during a first start's conversion: the load gives up (LoadStopped), and the worker must not say it
    # could not start (exit 3, "could not load model"): the supervisor exits as the signal's (130) on this code.
    from engine.load_stop import LoadStopped, StopFlag
    from service import app as app_module
    from service.process.restarts import EXIT_STOPPED_LOADING

    stopping = StopFlag()
    stopping.set()  # the worker's first SIGINT (install_drain)

    def exit_(code: int) -> None:  # os._exit ends the process: here, the call
        raise SystemExit(code)

    monkeypatch.setattr(app_module, "LOADS", stopping)
    monkeypatch.setattr(app_module.os, "_exit", exit_)

    async def gives_up(config: ServiceConfig) -> None:
        raise LoadStopped("stopped while converting demo.gguf")

    monkeypatch.setattr(app_module, "open_engine", gives_up)
    with pytest.raises(SystemExit) as exited:
        await app_module._open_engine_or_exit(ServiceConfig(model="demo.gguf"))
    assert exited.value.code == EXIT_STOPPED_LOADING
    with pytest.raises(SystemExit) as exited:
        app_module._exit_fatal(LoadStopped("stopped while importing whisper"), False)  # a hook's load (Whisper)
    assert exited.value.code == EXIT_STOPPED_LOADING


def test_a_worker_stopped_before_its_load_gave_up_still_exits_as_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    # A Ctrl-C while a cached model loaded: granian stopped the worker, cancelling the load before it could give up by
    # itself, and the worker (so the server) exited 0, not 130 as the README says.
    from engine.load_stop import LoadStopped, StopFlag
    from service import app as app_module

    stopping = StopFlag()
    stopping.set()  # the worker's first SIGINT (install_drain)
    monkeypatch.setattr(app_module, "LOADS", stopping)
    fatal: list[tuple[BaseException, bool]] = []

    async def never_loads(config: ServiceConfig) -> Any:
        await anyio.sleep_forever()

    state = AppState(load_engine=never_loads, load_in_background=True,
                     on_fatal=lambda exc, served: fatal.append((exc, served)))
    with TestClient(create_app(state)):
        pass  # started (the load runs in the background), then stopped while it still runs
    assert len(fatal) == 1 and isinstance(fatal[0][0], LoadStopped) and fatal[0][1] is False
