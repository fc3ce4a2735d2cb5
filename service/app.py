"""The Litestar app factory and its lifespan: the one owner of the engine, whose driver loop runs in an
anyio task group for the app's life.

`create_app(state)` builds the app around an AppState (a ready engine, or a loader the lifespan runs);
`app_from_env()` is the factory granian imports in its worker (options from the environment).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, AsyncIterator, Callable

import anyio
import anyio.abc
from litestar import Litestar
from litestar.config.cors import CORSConfig
from litestar.datastructures import State
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Server
from litestar.types import ControllerRouterHandler

from engine.load_stop import LOADS, LoadStopped, check_stop
from service.admin.routes import health, list_models, livez, metrics, ping, retrieve_model, stats
from service.chat.completions import completions
from service.chat.routes import chat_completions
from service.config import ServiceConfig
from service.engines import open_engine
from service.admin.metrics import ServiceMetrics
from service.http.access_log import AccessLog
from service.http.auth import CORS_METHODS, EXPOSED_HEADERS
from service.http.forwarded import TrustedProxies
from service.http.guard import Guard
from service.http.head import HeadAsGet
from service.http.handlers import EXCEPTION_HANDLERS
from service.http.json_body import MAX_JSON_DEPTH_KEY, DepthLimitedRequest
from service.logs import configure_logging
from service.messages.errors import AnthropicErrors
from service.messages.routes import count_message_tokens, create_message
from service.pi.route import pi_provider
from service.tokenize.routes import detokenize, tokenize, tokenizer_info
from service.responses.routes import (count_input_tokens, create_response, delete_response, list_input_items,
                                      retrieve_response)
from service.process.cleanup import loading_models
from service.process.drain import install_drain
from service.process.gc_pauses import ready_for_serving
from service.process.parent import exit_with_parent
from service.process.restarts import EXIT_SERVING_FAILED, EXIT_STARTUP_FAILED, EXIT_STOPPED_LOADING
from service.process.supervisor import worker_generation
from service.seams import ChatEngine
from service.speech.client_secret_routes import create_client_secret, create_transcription_session
from service.speech.live import live, realtime
from service.speech.sessions import append_session_audio, create_session, delete_session, finish_session
from service.speech.setup import install_speech, speech_config
from service.speech.transcriptions import create_transcription
from service.speech.translations import create_translation
from service.state import STATE_KEY, AppState

__all__ = ["create_app", "app_from_env", "route_handlers", "API_VERSION", "READY_LINE"]

_log = logging.getLogger("tandem.service")

API_VERSION = "0.1.0"
# Logged each time the server becomes ready (after a respawn too); process tests and tools wait for it.
READY_LINE = "ready: serving requests"


def route_handlers() -> list[ControllerRouterHandler]:
    """Every route of the API. A new route is one import and one entry here."""
    return [
        chat_completions, completions, create_response, count_input_tokens, retrieve_response, delete_response,
        list_input_items,
        create_message, count_message_tokens,
        list_models, retrieve_model, health, ping, livez, stats, metrics,
        create_transcription, create_translation,
        create_session, append_session_audio, finish_session, delete_session, live, realtime,
        create_client_secret, create_transcription_session,
        pi_provider,
        tokenize, detokenize, tokenizer_info,
    ]


def _lifespan(state: AppState) -> Callable[[Litestar], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        state.tokenize_limiter = anyio.CapacityLimiter(1)
        stop = anyio.Event()
        loading = False
        async with anyio.create_task_group() as tg:
            state.task_group = tg
            if state.drain_on_signals and not install_drain(state):
                _log.warning("cannot take over SIGTERM here: streams are cut at shutdown, not drained")
            if state.load_in_background:
                # The worker serves at once (503 with Retry-After while loading), so a respawned worker
                # answers the clients queued at the port instead of leaving them waiting for the load.
                tg.start_soon(_run_in_background, state, stop)
            else:
                await tg.start(_run_service, state, stop)
            try:
                yield
            finally:
                stop.set()
                loading = not state.ready
                if loading:  # still loading (or failed to): nothing waits for `stop` yet
                    tg.cancel_scope.cancel()
        state.task_group = None
        if loading and LOADS.is_set() and state.on_fatal is not None:
            # Stopped by a signal before the models were up, the load cancelled before it could give up by itself:
            # the worker's exit says so (the supervisor's is then the signal's, 130 for a Ctrl-C), not a clean 0.
            state.on_fatal(LoadStopped("stopped while loading the models"), False)

    return lifespan


async def _run_in_background(state: AppState, stop: anyio.Event) -> None:
    served = False
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(_run_service, state, stop)
            served = True  # what fails from here failed while serving, not at startup
    except Exception as exc:  # the worker's fatal handler decides
        if state.on_fatal is None:
            raise
        state.on_fatal(exc, served)


async def _run_service(state: AppState, stop: anyio.Event, *,
                       task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Load (when asked), run the engine loop, warm up, enter the hooks, be ready until `stop`, then
    unwind in reverse. Raises what loading or a hook raises at startup."""
    if state.engine is None and state.load_engine is not None:
        with loading_models():  # a conversion in progress is not taken for an interrupted one
            state.engine = await state.load_engine(state.config)
        check_stop(LOADS, "loading the model")  # the process began to stop meanwhile: nobody waits for it
        _log_banner(state)
    engine = state.engine
    engine_done = anyio.Event()

    async def run_engine(engine: ChatEngine, *,
                         task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            # started() does not yield: serve() is entered before startup goes on, so a hook failing
            # right away closes a running engine rather than one that never started.
            task_status.started()
            await engine.serve()
        finally:
            engine_done.set()

    async with anyio.create_task_group() as tg:
        if engine is not None:
            await tg.start(run_engine, engine)
            await _warm_up(state, engine)
        try:
            async with contextlib.AsyncExitStack() as hooks:
                with loading_models():
                    for hook in state.lifespan_hooks:
                        await hooks.enter_async_context(hook(state))
                check_stop(LOADS, "starting")
                if frozen := ready_for_serving(state.config.freeze_gc, state.config.gc_thresholds):
                    _log.info("gc: %d objects from startup frozen out of collections", frozen)
                state.ready = True
                _log.info("%s", READY_LINE)
                task_status.started()
                await stop.wait()
        finally:
            state.ready = False
            if engine is not None:
                engine.close()
                # serve() returns after close(); never let a stuck loop hang shutdown.
                with anyio.CancelScope(shield=True), anyio.move_on_after(30):
                    await engine_done.wait()
            tg.cancel_scope.cancel()


async def _warm_up(state: AppState, engine: Any) -> None:
    warm_up = getattr(engine, "warm_up", None)
    if warm_up is None or state.config.warmup is False:
        return

    def report(line: str) -> None:
        _log.info("%s", line)

    took = await warm_up(report, force=state.config.warmup)
    if took:
        report(f"warm-up done in {took:.1f} s (kernels compiled; first clients do not wait for them)")


def _log_banner(state: AppState) -> None:
    engine = state.engine
    if engine is None or engine.tokenizer is None:
        return
    lines = [f"model: {state.chat_model_name} (context {_context(engine)})"]
    if engine.plan is not None:
        lines += [f"plan: {reason}" for reason in engine.plan.reasons]
    if defaults := engine.sampling_defaults:  # requests that leave these fields out get them
        lines.append("sampling defaults (generation_config.json): "
                     + ", ".join(f"{k} {v:g}" for k, v in sorted(defaults.items())))
    from engine.backend import blas_info

    blas = blas_info().describe()
    if not any(blas in line for line in lines):  # the plan may already list it among its reasons
        lines.append(blas)
    for line in lines:
        _log.info("%s", line)


def _context(engine: ChatEngine) -> str:
    """The banner's context: the model's, and what one request can use when the memory budget holds less."""
    context, usable = engine.context_length, engine.max_model_len
    if context is None:
        return "? tokens"
    if usable is None or usable >= context:
        return f"{context} tokens"
    return f"{context} tokens; {usable} fit the memory budget for one request"


def create_app(state: AppState | None = None) -> Litestar:
    """Build the Litestar app. Raises nothing; model loading happens in the lifespan (startup)."""
    state = state or AppState()
    if state.config.model:
        state.model_aliases.add(state.config.model)
    state.config.limits.check()
    if state.metrics is None:
        state.metrics = ServiceMetrics(state)
    origins = [o.rstrip("/") for o in state.config.allowed_origins]  # as browsers send an Origin (no slash)
    app = Litestar(
        route_handlers=route_handlers(),
        lifespan=[_lifespan(state)],
        exception_handlers=EXCEPTION_HANDLERS,
        # Browsers may call the server only from the origins it was started with (none by default).
        cors_config=CORSConfig(allow_origins=origins, allow_methods=list(CORS_METHODS),
                               # Any header: the openai SDK sends x-stainless-*, pi session-affinity headers.
                               allow_headers=["*"],
                               expose_headers=EXPOSED_HEADERS) if origins else None,
        # Body sizes are checked by the guard, per route and as the body arrives.
        request_max_body_size=None,
        request_class=DepthLimitedRequest,
        state=State({STATE_KEY: state, MAX_JSON_DEPTH_KEY: state.config.limits.max_json_depth}),
        openapi_config=OpenAPIConfig(
            title="mlx-tandem",
            version=API_VERSION,
            description="OpenAI-compatible chat and speech on one cooperative MLX scheduler.",
            # Relative to /docs/swagger: "Try it out" calls the server the page came from (its port, a proxy's prefix).
            servers=[Server(url="..")],
            path="/docs",
        ),
        debug=False,
        # Our loggers only (service/logs.py): Litestar's default adds a queue listener thread writing to whatever
        # stderr was when the first app was built (in tests, a capture closed long before it writes).
        logging_config=None,
    )
    # Around everything Litestar does (routing, 404s, CORS): the guard (keys, origins, readiness, body
    # limits), and outside it one log line and the request metrics per request, whatever answered it.
    paths = frozenset(route.path for route in app.routes if "{" not in route.path)
    # Outermost: error answers on /v1/messages in Anthropic's shape (the access log still reads OpenAI's).
    app.asgi_handler = AnthropicErrors(AccessLog(HeadAsGet(Guard(app.asgi_handler, state)), state.metrics, paths,
                                                 TrustedProxies(state.config.forwarded_allow_ips),
                                                 state.recent_durations))
    return app


def app_from_env() -> Litestar:
    """granian's factory target: options from the environment (service.config), engine built after startup
    (503 with Retry-After meanwhile). The worker dies with its supervisor, drains on SIGTERM, and exits
    with EXIT_STARTUP_FAILED when its models cannot start.

    Raises ValueError for a malformed TANDEM_SERVE_CONFIG."""
    from engine.backend import ensure_fast_blas

    exit_with_parent()  # first: a worker must never outlive the process that owns the port
    config = ServiceConfig.from_env()
    configure_logging(config.log_level, config.log_format)
    ensure_fast_blas()  # the worker is a fresh interpreter: fast BLAS before the model load imports mlx
    state = AppState(config=config, load_engine=_open_engine_or_exit, load_in_background=True,
                     drain_on_signals=True, restarting=worker_generation() > 0, on_fatal=_exit_fatal)
    if speech_config(config) is not None:
        if config.isolate:  # speech runs in the engine process, beside its engine; the routes use it there
            from service.isolate.speech import remote_speech_lifespan

            state.lifespan_hooks.append(remote_speech_lifespan)
        else:
            install_speech(state)
    return create_app(state)


def _exit_fatal(exc: BaseException, served: bool) -> None:
    if not served and LOADS.is_set():
        _exit_stopped_loading()
    if served:  # a crash while serving: the supervisor respawns the worker (any exit code but startup's)
        _log.error("the service failed while serving; the worker exits to be respawned", exc_info=exc)
        os._exit(EXIT_SERVING_FAILED)
    # The cause, not "unhandled errors in a TaskGroup": the traceback of what the group held.
    _log.error("could not start: %s: %s", type(exc).__name__, exc, exc_info=exc if isinstance(exc, BaseExceptionGroup) else None)
    os._exit(EXIT_STARTUP_FAILED)


async def _open_engine_or_exit(config: ServiceConfig) -> ChatEngine:
    # In the granian worker a failed load ends the worker with one clear line (the supervisor then stops
    # with exit code 1, not respawning it) instead of tracebacks; in-process apps use open_engine directly.
    try:
        if config.isolate:
            from service.isolate.remote import open_isolated_engine

            return await open_isolated_engine(config)
        return await open_engine(config)
    except Exception as exc:
        if LOADS.is_set():  # the load gave up (LoadStopped), or failed as the engine process was told to stop
            _exit_stopped_loading()
        _log.error("could not load model %s: %s: %s", config.model or "(default)", type(exc).__name__, exc)
        os._exit(EXIT_STARTUP_FAILED)


def _exit_stopped_loading() -> None:
    # SIGINT/SIGTERM before the models were up: the supervisor exits as the signal's (130 for a Ctrl-C).
    os._exit(EXIT_STOPPED_LOADING)
