"""The Litestar app factory and its lifespan: one anyio task group owning the engine's driver loop.

`create_app(state)` builds the app around an AppState (a ready engine, or a loader that builds one during
startup); `app_from_env()` is the factory granian imports in its worker (options from the environment).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, AsyncContextManager, AsyncIterator, Awaitable, Callable

import anyio
import anyio.abc
from anyio.abc import TaskGroup
from litestar import Litestar, Request
from litestar.config.cors import CORSConfig
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Server

from service.config import ServiceConfig
from service.errors import EXCEPTION_HANDLERS
from service.schemas import ModelCard

__all__ = ["AppState", "create_app", "app_from_env", "get_state", "open_engine", "route_handlers", "API_VERSION"]

_log = logging.getLogger("tandem.service")

API_VERSION = "0.1.0"

# An async context manager entered after the engine starts and left before it closes (speech, sessions).
LifespanHook = Callable[["AppState"], AsyncContextManager[None]]


@dataclass
class AppState:
    """Everything the routes share. `engine` is an engine.runtime.Engine (or a test double) or None."""

    config: ServiceConfig = field(default_factory=ServiceConfig)
    engine: Any | None = None
    # Builds the engine during startup (model loads run on the engine thread); None: use `engine` as is.
    load_engine: Callable[[ServiceConfig], Awaitable[Any]] | None = None
    lifespan_hooks: list[LifespanHook] = field(default_factory=list)
    # Non-chat models shown in /v1/models (e.g. the Whisper model), keyed by id.
    extra_models: dict[str, ModelCard] = field(default_factory=dict)
    # Other names a client may use for the chat model (CLI spec, file name, repo id).
    model_aliases: set[str] = field(default_factory=set)
    task_group: TaskGroup | None = None
    # Set by service.speech_setup's lifespan hook: the SpeechService and the names its model answers to.
    speech: Any | None = None
    speech_aliases: set[str] = field(default_factory=set)
    ready: bool = False
    started_at: float = field(default_factory=time.time)
    # HF tokenizers are not safe for concurrent use: chat templating runs in a worker thread, one at a time.
    tokenize_limiter: anyio.CapacityLimiter | None = None
    # audio.speech.SpeechService while speech is served (service/speech_setup.py), and its model aliases.
    speech: Any | None = None
    speech_aliases: set[str] = field(default_factory=set)

    @property
    def chat_model_name(self) -> str | None:
        """Id of the loaded chat model, or None when there is none. Raises nothing."""
        if self.engine is None or getattr(self.engine, "tokenizer", None) is None:
            return None
        return self.config.served_model_name or self.engine.model_name

    def model_cards(self) -> list[ModelCard]:
        """Every served model, chat model first. Raises nothing."""
        cards = []
        if (name := self.chat_model_name) is not None:
            cards.append(
                ModelCard(
                    id=name,
                    created=int(self.started_at),
                    kind="chat",
                    context_length=getattr(self.engine, "context_length", None),
                )
            )
        return cards + list(self.extra_models.values())


def get_state(request: Request[Any, Any, Any]) -> AppState:
    """The AppState of the app serving `request`. Raises KeyError when the app was not built by create_app."""
    return request.app.state["tandem"]


def route_handlers() -> list[Any]:
    """Every route of the API. Later routes add one import and one entry here."""
    from service import admin, audio_routes, chat, pi

    return [
        *chat.ROUTES,
        *admin.ROUTES,
        *audio_routes.ROUTES,
        *pi.ROUTES,
    ]


async def open_engine(config: ServiceConfig) -> Any:
    """Load the configured chat model and build the engine around it.

    Raises engine.models.ModelNotFound when no model can be found, and whatever loading raises."""
    from engine.runtime import Engine

    # The model loads on the engine's own thread (MLX streams are per thread), off the event loop.
    return await Engine.open(config.model, max_active=config.max_active,
                             max_iteration_tokens=config.max_iteration_tokens,
                             prompt_cache_bytes=config.prompt_cache_bytes, memory_budget=config.memory_budget)


def _lifespan(state: AppState) -> Callable[[Litestar], AsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        state.tokenize_limiter = anyio.CapacityLimiter(1)
        async with anyio.create_task_group() as tg:
            state.task_group = tg
            if state.engine is None and state.load_engine is not None:
                state.engine = await state.load_engine(state.config)
                _print_banner(state)
            engine = state.engine
            engine_done = anyio.Event()

            async def run_engine(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
                try:
                    # started() does not yield: serve() is entered before startup goes on, so a hook
                    # failing right away closes a running engine rather than one that never started.
                    task_status.started()
                    await engine.serve()
                finally:
                    engine_done.set()

            if engine is not None:
                await tg.start(run_engine)
                await _warm_up(state, engine)
            try:
                async with contextlib.AsyncExitStack() as hooks:
                    for hook in state.lifespan_hooks:
                        await hooks.enter_async_context(hook(state))
                    state.ready = True
                    yield
            finally:
                state.ready = False
                if engine is not None:
                    engine.close()
                    # serve() returns after close(); never let a stuck loop hang shutdown.
                    with anyio.CancelScope(shield=True), anyio.move_on_after(30):
                        await engine_done.wait()
                tg.cancel_scope.cancel()
            state.task_group = None

    return lifespan


async def _warm_up(state: AppState, engine: Any) -> None:
    warm_up = getattr(engine, "warm_up", None)
    if warm_up is None or state.config.warmup is False:
        return

    def report(line: str) -> None:
        print(f"tandem: {line}", file=sys.stderr, flush=True)

    took = await warm_up(report, force=state.config.warmup)
    if took:
        report(f"warm-up done in {took:.1f} s (kernels compiled; first clients do not wait for them)")


def _print_banner(state: AppState) -> None:
    engine = state.engine
    if engine is None:
        return
    lines = [f"model: {state.chat_model_name} (context {getattr(engine, 'context_length', '?')} tokens)"]
    plan = getattr(engine, "plan", None)
    if plan is not None:
        reasons = getattr(plan, "reasons", None) or getattr(plan, "as_dict", lambda: {})().get("reasons", [])
        for reason in reasons or [str(plan)]:
            lines.append(f"plan: {reason}")
    try:
        from engine.backend import blas_info

        blas = blas_info().describe()
        if not any(blas in line for line in lines):  # the plan may already list it among its reasons
            lines.append(blas)
    except Exception:  # backend module absent or failing: the banner is informational only
        pass
    print("\n".join(f"tandem: {line}" for line in lines), file=sys.stderr, flush=True)


def create_app(state: AppState | None = None) -> Litestar:
    """Build the Litestar app. Raises nothing; model loading happens in the lifespan (startup)."""
    state = state or AppState()
    if state.config.model:
        state.model_aliases.add(state.config.model)
    return Litestar(
        route_handlers=route_handlers(),
        lifespan=[_lifespan(state)],
        exception_handlers=EXCEPTION_HANDLERS,
        # A local server: browser UIs on any origin may call it, as with mlx_lm.server and llama.cpp.
        cors_config=CORSConfig(allow_origins=["*"], allow_methods=["*"], allow_headers=["*"]),
        state=_app_state(state),
        openapi_config=OpenAPIConfig(
            title="mlx-tandem",
            version=API_VERSION,
            description="OpenAI-compatible chat and speech on one cooperative MLX scheduler.",
            servers=[Server(url="http://127.0.0.1:8080")],
            path="/docs",
        ),
        debug=False,
    )


def _app_state(state: AppState) -> Any:
    from litestar.datastructures import State

    return State({"tandem": state})


def app_from_env() -> Litestar:
    """granian's factory target: options from the environment (service.config), engine built at startup.

    Raises ValueError for a malformed TANDEM_SERVE_CONFIG."""
    config = ServiceConfig.from_env()
    state = AppState(config=config, load_engine=_open_engine_or_exit)
    if "speech" in config.extra:
        from service.speech_setup import install_speech

        install_speech(state)
    return create_app(state)


async def _open_engine_or_exit(config: ServiceConfig) -> Any:
    # In the granian worker a failed load ends the worker with one clear line (granian then stops with
    # exit code 1) instead of two lifespan tracebacks; in-process apps (tests) use open_engine directly.
    try:
        return await open_engine(config)
    except Exception as exc:
        print(f"tandem: could not load model {config.model or '(default)'}: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
        os._exit(3)
