"""Minting client secrets for browsers' live sockets: OpenAI's GA `POST /v1/realtime/client_secrets` and the beta
`POST /v1/realtime/transcription_sessions`. A page's backend, holding the API key, mints one and hands it to the
page, which connects with it as the `openai-insecure-api-key.<secret>` subprotocol (the store and its rules:
service/speech/client_secrets.py). The session settings given are checked as `session.update` checks them, so a
refusal comes now, naming the field, rather than when the page connects."""

from __future__ import annotations

import json
import secrets
from typing import Any

from litestar import Request, post

from audio.errors import AudioError
from audio.transcript import TranscribeOptions
from service.http.auth import client_key
from service.http.errors import APIError, api_error
from service.http.openapi import error_responses
from service.seams import SpeechBackend
from service.speech.client_secrets import MAX_SESSION_BYTES
from service.speech.realtime_config import ConfigError, Dialect, RealtimeConfig, field_paths
from service.speech.session_schemas import (
    BetaClientSecret,
    ClientSecretCreated,
    ClientSecretCreateRequest,
    ExpiresAfter,
    TranscriptionSessionCreated,
    TranscriptionSessionCreateRequest,
)
from service.speech.served import served_speech
from service.speech.transcription_fields import transcription_params
from service.state import AppState, get_state

__all__ = ["create_client_secret", "create_transcription_session", "BETA_DEFAULT_SECONDS"]

_ERRORS = error_responses({400: "A field that cannot be honoured, named (OpenAI error shape)",
                           404: "No Whisper model served, or the session names another (code model_not_found)",
                           413: "Body over the size limit"})
# OpenAI's beta secrets lived a minute ("currently, all tokens expire after one minute"); GA ones 600 s by default.
BETA_DEFAULT_SECONDS = 60


@post("/v1/realtime/client_secrets", status_code=200, tags=["audio"], responses=_ERRORS,
      summary="Mint a client secret for a browser's live transcription socket",
      description="OpenAI-compatible (transcription sessions). The secret opens `/v1/realtime` and `/v1/audio/live` "
                  "websockets, offered as the subprotocol `openai-insecure-api-key.<value>`, until `expires_at`; "
                  "each socket belongs to the key that minted it and starts with `session` applied.")
async def create_client_secret(request: Request[Any, Any, Any], data: ClientSecretCreateRequest) -> ClientSecretCreated:
    """Raises APIError (400 a field that cannot be honoured, 404 no Whisper model or another model named)."""
    state = get_state(request)
    config, speech = _checked(state, data.session, "ga", prefix="session.")
    seconds = (data.expires_after or ExpiresAfter()).seconds
    value, secret = state.client_secrets.mint(client_key(request), seconds, data.session, "ga")
    return ClientSecretCreated(value=value, expires_at=secret.expires_at,
                               session=config.session_object("ga", _session_id(), speech.model_name))


@post("/v1/realtime/transcription_sessions", status_code=200, tags=["audio"], responses=_ERRORS,
      summary="Mint a client secret with a beta transcription session",
      description="OpenAI's beta route (`client.beta.realtime.transcription_sessions.create`): the body is the "
                  "session as `transcription_session.update` takes it, plus `client_secret.expires_at` (default "
                  f"{BETA_DEFAULT_SECONDS} s); the answer is the session with `client_secret: {{value, expires_at}}`.")
async def create_transcription_session(request: Request[Any, Any, Any],
                                       data: TranscriptionSessionCreateRequest) -> TranscriptionSessionCreated:
    """Raises APIError (400 a field that cannot be honoured, 404 no Whisper model or another model named)."""
    state = get_state(request)
    session = data.model_dump(exclude_unset=True, exclude={"client_secret"})
    config, speech = _checked(state, session, "beta", prefix="")
    expiry = data.client_secret.expires_at if data.client_secret is not None else None
    seconds = expiry.seconds if expiry is not None else BETA_DEFAULT_SECONDS
    value, secret = state.client_secrets.mint(client_key(request), seconds, session, "beta")
    shown = config.session_object("beta", _session_id(), speech.model_name)
    return TranscriptionSessionCreated(**shown, client_secret=BetaClientSecret(value=value,
                                                                               expires_at=secret.expires_at))


def _checked(state: AppState, session: dict[str, Any] | None, dialect: Dialect,
             prefix: str) -> tuple[RealtimeConfig, SpeechBackend]:
    """The settings a socket opened with the secret starts with: the served defaults with `session` applied as an
    update. `prefix` is where the session's fields sit in the body ("session." or the body itself). Raises
    APIError 400 naming the field, 404 model_not_found."""
    speech = served_speech(state, None)
    config = RealtimeConfig.initial(vad=speech.vad_default)  # as a socket starts (--no-vad: no turn detection)
    if session is None:
        return config, speech
    if len(json.dumps(session)) > MAX_SESSION_BYTES:
        raise APIError(400, f"the session settings take more than {MAX_SESSION_BYTES} bytes of JSON",
                       param=prefix.rstrip(".") or None, code="invalid_value")

    def named(param: str) -> str:  # realtime_config names fields under "session."
        return prefix + param.removeprefix("session.")

    try:
        config = config.updated(session, dialect)
    except ConfigError as exc:
        raise APIError(400, exc.message, param=named(exc.param), code=exc.code) from None
    where, vad_where = (named(path) for path in field_paths(session, dialect))
    served_speech(state, config.model, param=f"{where}.model")
    try:
        speech.options(**config.decoding(), temperatures=TranscribeOptions.ladder(0.0))
    except AudioError as exc:
        refusal = api_error(exc, params=transcription_params(where, len(config.languages)))
        if refusal.param is not None and refusal.param.startswith("vad"):
            refusal.param = vad_where
        raise refusal from None
    return config, speech


def _session_id() -> str:
    # OpenAI's answer names a session; each socket the secret opens gets a session (and id) of its own.
    return "sess_" + secrets.token_hex(12)
