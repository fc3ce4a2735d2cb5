"""AppState — everything the routes share — and `get_state`, how a route reaches it.

Routes import this module, never the app factory: the factory (service/app.py) imports the routes.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Literal, Mapping

import anyio
from anyio.abc import TaskGroup
from litestar import Request
from litestar.connection import ASGIConnection

from service.admin.schemas import ModelCard
from service.config import ServiceConfig
from service.http.retry_after import RecentDurations
from service.process.inflight import InFlight
from service.seams import ChatEngine, SpeechBackend
from service.speech.client_secrets import ClientSecrets
from service.responses.item_cache import IssuedItems

__all__ = ["AppState", "LifespanHook", "EngineLoader", "Phase", "get_state", "scope_state", "STATE_KEY"]

# Where create_app keeps the AppState in Litestar's app.state.
STATE_KEY = "tandem"

# An async context manager entered after the engine starts and left before it closes (speech, sessions).
LifespanHook = Callable[["AppState"], contextlib.AbstractAsyncContextManager[None]]
# Builds the engine during startup (model loads run on the engine thread, off the event loop).
EngineLoader = Callable[[ServiceConfig], Awaitable[ChatEngine]]
# Where the server is in its life: /health reports it, and the guard answers 503 outside "ready".
Phase = Literal["loading", "restarting", "ready", "stopping"]


@dataclass
class AppState:
    """The engine (or a loader the app factory runs at startup), speech, served names, readiness."""

    config: ServiceConfig = field(default_factory=ServiceConfig)
    # Set by the app factory only: given here, or built by `load_engine` in the lifespan.
    engine: ChatEngine | None = None
    load_engine: EngineLoader | None = None
    lifespan_hooks: list[LifespanHook] = field(default_factory=list)
    # Load the engine after startup, answering 503 meanwhile (the granian worker); tests load first.
    load_in_background: bool = False
    # What a background start does with a model or hook that fails (the worker exits; None: re-raise).
    # What a background start does with a failure: (the error, whether it came after the service was ready).
    on_fatal: Callable[[BaseException, bool], None] | None = None
    # Non-chat models shown in /v1/models (e.g. the Whisper model), keyed by id.
    extra_models: dict[str, ModelCard] = field(default_factory=dict)
    # Other names a client may use for the chat model (CLI spec, file name, repo id).
    model_aliases: set[str] = field(default_factory=set)
    task_group: TaskGroup | None = None
    # The SpeechService while speech is served (service/speech/setup.py), and the names its model answers to.
    speech: SpeechBackend | None = None
    speech_aliases: set[str] = field(default_factory=set)
    ready: bool = False
    # This worker replaces one that died (the supervisor respawned it): "restarting" until ready.
    restarting: bool = False
    # SIGTERM received: admission stopped, streams finishing (service/process/drain.py).
    draining: bool = False
    # Take over SIGTERM/SIGINT to drain before stopping (the granian worker; tests send no signals).
    drain_on_signals: bool = False
    # Requests and websockets open now (the guard counts them; draining waits for zero).
    inflight: InFlight = field(default_factory=InFlight)
    started_at: float = field(default_factory=time.time)
    # Client secrets minted for browsers' live sockets (POST /v1/realtime/client_secrets); the guard accepts them.
    client_secrets: ClientSecrets = field(default_factory=ClientSecrets)
    # Output items /v1/responses issued lately, for requests that refer to them (item_reference).
    issued_items: IssuedItems = field(default_factory=IssuedItems)
    # Prometheus metrics of this app (service/admin/metrics.py), set by the app factory.
    metrics: Any = None
    # How long generation requests took lately: a 429 queue_full's Retry-After (service/http/retry_after.py).
    recent_durations: RecentDurations = field(default_factory=RecentDurations)
    # HF tokenizers are not safe for concurrent use: chat templating runs in a worker thread, one at a time.
    tokenize_limiter: anyio.CapacityLimiter | None = None

    @property
    def phase(self) -> Phase:
        """loading, restarting, ready or stopping. Raises nothing."""
        if self.draining:
            return "stopping"
        if self.ready:
            return "ready"
        return "restarting" if self.restarting else "loading"

    @property
    def chat_model_name(self) -> str | None:
        """Id of the loaded chat model, or None when there is none. Raises nothing."""
        if self.engine is None or self.engine.tokenizer is None:
            return None
        return self.config.served_model_name or self.engine.model_name

    def model_cards(self) -> list[ModelCard]:
        """Every served model, chat model first. Raises nothing."""
        cards = []
        if (name := self.chat_model_name) is not None and self.engine is not None:
            # The context a request can really use (the memory budget may hold less than the model's): clients size
            # their prompts by context_length (aider, `tandem pi`) or max_model_len (vLLM's clients).
            usable = self.engine.max_model_len
            cards.append(ModelCard(id=name, created=int(self.started_at), kind="chat", context_length=usable,
                                   root=self.engine.model_root, max_model_len=usable))
        return cards + list(self.extra_models.values())


def get_state(connection: Request[Any, Any, Any] | ASGIConnection[Any, Any, Any, Any]) -> AppState:
    """The AppState of the app serving `connection` (a request or a websocket).

    Raises KeyError when the app was not built by create_app."""
    state: AppState = connection.app.state[STATE_KEY]
    return state


def scope_state(scope: Mapping[str, Any]) -> AppState | None:
    """The AppState of the app an ASGI scope is served by, for code that runs before or around routing (the guard's
    key check, a streaming response's sends); None outside an app built by create_app. Raises nothing."""
    state = getattr(scope.get("app"), "state", None)
    found = state.get(STATE_KEY) if state is not None else None
    return found if isinstance(found, AppState) else None
