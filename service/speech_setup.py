"""Wiring speech into the app: options under ServiceConfig.extra["speech"], and the lifespan hook that
builds the SpeechService on the engine's task queue and runs its maintenance loop."""

from __future__ import annotations

import contextlib
import functools
import sys
from dataclasses import asdict, dataclass
from typing import AsyncIterator

import anyio

from service.app import AppState
from service.config import ServiceConfig
from service.schemas import ModelCard

__all__ = ["SpeechConfig", "speech_config", "speech_lifespan", "install_speech", "check_whisper_model"]

CONFIG_KEY = "speech"


@dataclass
class SpeechConfig:
    """`tandem serve` speech options: model spec (None = demo tiny.en), residency and session TTL."""

    model: str | None = None
    idle_unload_sec: float = 0.0
    resident: bool = False
    preload: bool = False
    session_ttl_sec: float = 300.0
    max_sessions: int = 64
    # `tandem serve some-whisper-model`: no chat model is loaded at all.
    transcription_only: bool = False

    def store(self, config: ServiceConfig) -> None:
        """Put these options into config.extra (travels to the granian worker). Raises nothing."""
        config.extra[CONFIG_KEY] = asdict(self)


def speech_config(config: ServiceConfig) -> SpeechConfig | None:
    """The speech options in `config`, or None when speech is off. Raises TypeError for unknown keys."""
    raw = config.extra.get(CONFIG_KEY)
    return None if raw is None else SpeechConfig(**raw)


def check_whisper_model(spec: str | None) -> str:
    """Resolve a --whisper-model before the server starts (imports a CTranslate2 checkpoint once).
    Returns the checkpoint dir. Raises audio.whisper.WhisperCheckpointError with a clear message."""
    from audio.whisper import resolve_whisper_checkpoint

    return str(resolve_whisper_checkpoint(spec))


@contextlib.asynccontextmanager
async def speech_lifespan(state: AppState) -> AsyncIterator[None]:
    """Build the SpeechService on state.engine's tasks (an Engine(None) when there is no chat model) and
    run it until shutdown. Raises WhisperCheckpointError at startup for a model that does not resolve."""
    from audio.speech import SpeechService

    options = speech_config(state.config) or SpeechConfig()
    async with anyio.create_task_group() as tg:
        engine = state.engine
        own_engine = engine is None
        if own_engine:  # transcription-only server: a tasks-only loop
            from engine.runtime import Engine

            engine = state.engine = Engine(None)
            tg.start_soon(engine.serve)
        speech = SpeechService.from_spec(engine.tasks, options.model, idle_unload_sec=options.idle_unload_sec,
                                         resident=options.resident, session_ttl_sec=options.session_ttl_sec,
                                         max_sessions=options.max_sessions)
        state.speech = speech  # type: ignore[attr-defined]
        state.speech_aliases = {a for a in (options.model, str(speech.residency.path)) if a}  # type: ignore[attr-defined]
        state.extra_models[speech.model_name] = ModelCard(id=speech.model_name, kind="transcription")
        print(f"tandem: speech: {speech.model_name} ({speech.residency.path}, {speech.residency.dtype}, "
              f"{'resident' if options.resident else f'idle unload after {options.idle_unload_sec:g} s'})",
              file=sys.stderr, flush=True)
        await tg.start(functools.partial(speech.run, preload=options.preload))
        try:
            yield
        finally:
            state.speech = None  # type: ignore[attr-defined]
            if own_engine:
                engine.close()
            tg.cancel_scope.cancel()


def install_speech(state: AppState, options: SpeechConfig | None = None) -> AppState:
    """Add speech to an AppState (tests and the CLI): stores options, appends the lifespan hook. Raises nothing."""
    if options is not None:
        options.store(state.config)
    elif CONFIG_KEY not in state.config.extra:
        SpeechConfig().store(state.config)
    if (speech_config(state.config) or SpeechConfig()).transcription_only:
        state.load_engine = None  # the speech hook drives an Engine(None)
    if speech_lifespan not in state.lifespan_hooks:
        state.lifespan_hooks.append(speech_lifespan)
    return state
