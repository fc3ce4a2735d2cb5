"""Wiring speech into the app: options under ServiceConfig.extra["speech"], and the lifespan hook that
builds the SpeechService on the engine's task queue and runs its maintenance loop.

The app factory owns the engine; this hook only uses its task queue. A transcription-only server gets a
tasks-only engine from the factory (`install_speech` sets the loader)."""

from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import asdict, dataclass
from typing import AsyncIterator, Literal, cast

import anyio

from audio.whisper import DEMO_ALIASES
from service.admin.schemas import ModelCard
from service.config import ServiceConfig
from service.engines import open_tasks_engine
from service.state import AppState

__all__ = ["SpeechConfig", "speech_config", "speech_lifespan", "install_speech", "key_session_cap", "CONFIG_KEY"]

CONFIG_KEY = "speech"

_log = logging.getLogger("tandem.speech")


@dataclass
class SpeechConfig:
    """`tandem serve` speech options: model spec (None = demo tiny.en), residency, session TTL and caps, the
    VAD default, and the Whisper step budget (audio/pacing.py StepBudget)."""

    model: str | None = None
    idle_unload_sec: float = 0.0
    resident: bool = False
    preload: bool = False
    session_ttl_sec: float = 300.0
    max_sessions: int = 64
    # With two or more API keys, one key holds at most this share of max_sessions (1: no cap).
    key_session_share: float = 0.5
    # `tandem serve some-whisper-model`: no chat model is loaded at all.
    transcription_only: bool = False
    vad: bool = True  # the default for requests that do not say
    max_session_sec: float = 3600.0  # audio one live session may receive
    max_buffered_sec: float = 1800.0  # untranscribed audio all live sessions may hold together
    max_lag_sec: float = 120.0  # untranscribed audio one live session may hold (its backlog)
    step_positions: int = 375  # StepBudget.encoder_positions
    step_tokens: int = 4  # StepBudget.decode_tokens
    chat_share: float = 0.3  # StepBudget.chat_share
    catch_up_sec: float = 1.0  # StepBudget.catch_up_seconds
    min_step_ms: float | None = None  # StepBudget.min_step_seconds × 1000 (None: by device)
    live_context: str = "auto"  # LiveConfig.context: auto | fit | whole

    def store(self, config: ServiceConfig) -> None:
        """Put these options into config.extra (travels to the granian worker). Raises nothing."""
        config.extra[CONFIG_KEY] = asdict(self)


def speech_config(config: ServiceConfig) -> SpeechConfig | None:
    """The speech options in `config`, or None when speech is off. Raises TypeError for unknown keys."""
    raw = config.extra.get(CONFIG_KEY)
    return None if raw is None else SpeechConfig(**raw)


def key_session_cap(options: SpeechConfig, keys: int) -> int | None:
    """The most live sessions one API key may hold: its share of max_sessions (at least 1) once two or more keys
    are configured, so one client cannot take every place while another waits; None (no cap) with fewer keys,
    where there is no other client to keep places for, or a share of 1. Raises nothing."""
    if keys < 2 or options.key_session_share >= 1:
        return None
    return max(1, int(options.max_sessions * options.key_session_share))


@contextlib.asynccontextmanager
async def speech_lifespan(state: AppState) -> AsyncIterator[None]:
    """Build the SpeechService on state.engine's task queue and run it until shutdown.

    Raises WhisperCheckpointError at startup for a model that does not resolve, RuntimeError when the app
    started no engine (create_app always does once install_speech ran)."""
    from audio.live import LiveConfig
    from audio.scheduler import StepBudget
    from audio.speech import SpeechService

    if state.engine is None:
        raise RuntimeError("speech needs the engine's task queue; the app started no engine")
    options = speech_config(state.config) or SpeechConfig()
    budget = StepBudget(encoder_positions=options.step_positions, decode_tokens=options.step_tokens,
                        chat_share=options.chat_share, catch_up_seconds=options.catch_up_sec,
                        min_step_seconds=None if options.min_step_ms is None else options.min_step_ms / 1000)
    live = LiveConfig(max_session_s=options.max_session_sec, max_lag_s=options.max_lag_sec,
                      context=cast(Literal["auto", "fit", "whole"], options.live_context))
    # Whisper steps shrink to a share of a chat iteration while chat rows decode (Engine.chat_pace).
    speech = SpeechService.from_spec(state.engine.tasks, options.model, idle_unload_sec=options.idle_unload_sec,
                                     resident=options.resident, session_ttl_sec=options.session_ttl_sec,
                                     max_sessions=options.max_sessions, budget=budget, live=live,
                                     max_buffered_sec=options.max_buffered_sec, pace=state.engine.chat_pace,
                                     vad=options.vad, turn=getattr(state.engine, "chat_turn", None),
                                     max_owner_sessions=key_session_cap(options, len(state.config.api_keys)))
    aliases = {a for a in (options.model, str(speech.residency.path)) if a}
    if options.model is None or options.model in DEMO_ALIASES:
        aliases |= DEMO_ALIASES
    async with anyio.create_task_group() as tg:
        state.speech, state.speech_aliases = speech, aliases
        state.extra_models[speech.model_name] = ModelCard(id=speech.model_name, kind="transcription")
        residency = "resident" if options.resident else f"idle unload after {options.idle_unload_sec:g} s"
        _log.info("speech: %s (%s, %s, %s)", speech.model_name, speech.residency.path, speech.residency.dtype,
                  residency)
        await tg.start(functools.partial(speech.run, preload=options.preload, warm_up=state.config.warmup))
        try:
            yield
        finally:
            state.speech = None
            tg.cancel_scope.cancel()


def install_speech(state: AppState, options: SpeechConfig | None = None) -> AppState:
    """Add speech to an AppState (tests and the CLI): stores options, appends the lifespan hook, and for a
    transcription-only server (or one given no chat engine) has the factory start a tasks-only engine.
    Raises nothing."""
    if options is not None:
        options.store(state.config)
    elif CONFIG_KEY not in state.config.extra:
        SpeechConfig().store(state.config)
    only = (speech_config(state.config) or SpeechConfig()).transcription_only
    if only or (state.engine is None and state.load_engine is None):
        state.load_engine = open_tasks_engine
    if speech_lifespan not in state.lifespan_hooks:
        state.lifespan_hooks.append(speech_lifespan)
    return state
