"""What a live-transcription socket (service/speech/live_socket.py) tells its client when something goes wrong: the
error event's error for an exception, the close code that goes with it, and the refusals of its own (bad base64
audio, a server shutting down, a session dropped for idleness)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
from typing import Any

from audio.errors import AudioError, SessionNotFound, SpeechStopped
from audio.sessions import LiveSession
from engine.errors import EngineRestarting
from service.http.errors import APIError, api_error, unavailable
from service.speech.realtime_config import ConfigError

__all__ = ["GONE", "as_api_error", "base64_audio", "close_code", "expiry", "shutting_down", "typed"]

# What a session served by reference (--isolate) raises once its engine process is gone: it died (restarting), or
# the server shut it down.
GONE = (SessionNotFound, EngineRestarting, SpeechStopped)

_log = logging.getLogger("tandem.speech")


def close_code(err: APIError) -> int:
    """The close code for a session refused or ended by `err`: 1013 (try again later) for a full house (429)
    or an engine process restarting (503), 1008 for the client's fault, else 1011. Raises nothing."""
    return 1013 if err.status in (429, 503) else 1008 if err.status < 500 else 1011


def base64_audio(audio: Any) -> bytes:
    if not isinstance(audio, str):
        raise APIError(400, "`audio` must be a base64 string", param="audio", code="invalid_value")
    try:
        return base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, "`audio` is not valid base64", param="audio", code="invalid_base64") from None


def shutting_down() -> APIError:
    return unavailable("The server is shutting down.", code="shutting_down")


def expiry(session: LiveSession) -> str | None:
    """Why the speech service dropped `session` for idleness (None: it did not). Raises nothing."""
    with contextlib.suppress(*GONE):  # --isolate: gone with its engine process
        return session.expired
    return None


def typed(exc: BaseException) -> bool:
    return isinstance(exc, (APIError, AudioError))


def as_api_error(exc: BaseException) -> APIError:
    """The error event's error for `exc`; one the tables do not know is a server fault, logged with its traceback
    (the client sees only "server_error"). Raises nothing."""
    if isinstance(exc, ConfigError):
        return APIError(400, exc.message, param=exc.param, code=exc.code)
    err = api_error(exc)
    if err.status >= 500 and not typed(exc):
        _log.error("live socket: unhandled error", exc_info=exc)
    return err
