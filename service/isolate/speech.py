"""Speech under `--isolate`: the SpeechService lives in the engine process with the engine it shares a loop
with; the API process's routes use it by reference (service/isolate/objects.py) through `RemoteSpeech`, which
always speaks to the current engine process (a restarted one serves a new SpeechService; sessions of the
process that died are gone)."""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, cast

from audio.errors import SpeechNotRunning
from service.admin.schemas import ModelCard
from service.isolate.remote import RemoteEngine
from service.seams import SpeechBackend
from service.state import AppState

__all__ = ["RemoteSpeech", "remote_speech_lifespan"]


class RemoteSpeech:
    """The SpeechBackend the routes see under --isolate (see module doc)."""

    def __init__(self, engine: RemoteEngine) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        speech = self._engine.speech()
        if speech is None:
            raise SpeechNotRunning("The engine process serves no speech.")
        return getattr(speech, name)


@contextlib.asynccontextmanager
async def remote_speech_lifespan(state: AppState) -> AsyncIterator[None]:
    """The speech hook of an isolated server: names and the model card from the engine process; the
    service itself stays there. Raises RuntimeError when the app's engine is not a RemoteEngine."""
    engine = state.engine
    if not isinstance(engine, RemoteEngine):
        raise RuntimeError("remote speech needs the --isolate engine")
    speech = RemoteSpeech(engine)
    model_name = str(speech.model_name)
    state.speech, state.speech_aliases = cast(SpeechBackend, speech), set(engine.speech_aliases)
    state.extra_models[model_name] = ModelCard(id=model_name, kind="transcription")
    try:
        yield
    finally:
        state.speech = None
