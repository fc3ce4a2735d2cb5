"""Pydantic models of live transcription sessions (/v1/audio/sessions) and of the client secrets a page's backend
mints for the Realtime socket — the OpenAPI source for those routes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from audio.pcm import SAMPLE_RATE
from service.speech.schemas import TranscriptionSegment

__all__ = [
    "SessionCreateRequest",
    "SessionCreated",
    "SessionAudioAccepted",
    "SessionFinished",
    "SessionDeleted",
    "LiveEvent",
    "ExpiresAfter",
    "ClientSecretCreateRequest",
    "ClientSecretCreated",
    "TranscriptionSessionCreateRequest",
    "TranscriptionSessionCreated",
]


class SessionCreateRequest(BaseModel):
    """POST /v1/audio/sessions: options for a live dictation session (an unknown field is refused by name)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, description="The Whisper model served here; default: it.")
    language: str | None = None
    prompt: str | None = None
    vocabulary: list[str] = Field(default_factory=list, description="Words to bias toward (joined into the prompt).")
    temperature: float = Field(0.0, ge=0.0, le=1.0)
    task: Literal["transcribe", "translate"] = "transcribe"
    vad: bool | None = Field(None, description="Whisper sees only the speech (webrtcvad), and a pause ends an "
                                               "utterance. Default: on, unless the server runs with --no-vad.")
    vad_min_speech_ms: int = Field(250, ge=30, le=10_000, description="Shorter voiced runs are not speech.")
    vad_min_silence_ms: int = Field(500, ge=30, le=10_000, description="A pause this long ends an utterance.")


class SessionCreated(BaseModel):
    id: str
    object: Literal["audio.session"] = "audio.session"
    model: str
    sample_rate: int = SAMPLE_RATE
    window_seconds: float = 30.0


class SessionAudioAccepted(BaseModel):
    """After each chunk: total audio received, how many 30 s windows are already decoded, and how far behind the
    transcription is (received audio not yet transcribed: a client sending faster than real time sees it grow)."""

    id: str
    received_seconds: float
    windows_done: int
    lag_seconds: float = 0.0


class SessionFinished(BaseModel):
    id: str
    text: str
    language: str
    duration: float
    segments: list[TranscriptionSegment] = Field(default_factory=list)


class SessionDeleted(BaseModel):
    id: str
    object: Literal["audio.session"] = "audio.session"
    deleted: bool = True


class LiveEvent(BaseModel):
    """Websocket /v1/audio/live server messages: `transcript.partial` (committed + tentative text),
    `transcript.done` (final text), `error`."""

    type: Literal["session.created", "transcript.partial", "transcript.done", "error"]
    id: str | None = None
    committed: str | None = None
    tentative: str | None = None
    text: str | None = None
    received_seconds: float | None = None
    windows_done: int | None = None
    lag_seconds: float | None = None
    message: str | None = None


# ---- client secrets (POST /v1/realtime/client_secrets, beta POST /v1/realtime/transcription_sessions) -------------


class ExpiresAfter(BaseModel):
    """How long a client secret opens sockets (OpenAI's `expires_after`)."""

    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"] = "created_at"
    seconds: int = Field(600, ge=10, le=7200, description="From its creation; 10 s to 2 h.")


class ClientSecretCreateRequest(BaseModel):
    """POST /v1/realtime/client_secrets (OpenAI's GA fields; an unknown one is refused by name)."""

    model_config = ConfigDict(extra="forbid")

    expires_after: ExpiresAfter | None = Field(None, description="Default: 600 s after its creation.")
    session: dict[str, Any] | None = Field(
        None, description="A transcription session (`type: \"transcription\"`, `audio.input`, `include`), checked as "
                          "`session.update` is, and applied to each socket the secret opens as if it were that "
                          "socket's first `session.update`.")


class ClientSecretCreated(BaseModel):
    """A client secret: a page offers it as the websocket subprotocol `openai-insecure-api-key.<value>`."""

    value: str = Field(description="The secret, `ek_...`: opens live websockets (not HTTP routes) until expires_at.")
    expires_at: int = Field(description="Unix seconds.")
    session: dict[str, Any] = Field(description="The session settings sockets opened with it start with, as "
                                                "`session.created` shows them (each socket's session has its own id).")


class BetaClientSecretOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    expires_at: ExpiresAfter | None = Field(None, description="Default: 60 s after its creation.")


class TranscriptionSessionCreateRequest(BaseModel):
    """POST /v1/realtime/transcription_sessions (OpenAI's beta fields, as `transcription_session.update` takes
    them, and `client_secret`; an unknown one is refused by name)."""

    model_config = ConfigDict(extra="forbid")

    client_secret: BetaClientSecretOptions | None = None
    input_audio_format: str | None = None
    input_audio_transcription: dict[str, Any] | None = None
    turn_detection: dict[str, Any] | None = None
    include: list[str] | None = None
    modalities: list[str] | None = None
    input_audio_noise_reduction: dict[str, Any] | None = None


class BetaClientSecret(BaseModel):
    value: str = Field(description="The secret, `ek_...`: opens live websockets (not HTTP routes) until expires_at.")
    expires_at: int = Field(description="Unix seconds.")


class TranscriptionSessionCreated(BaseModel):
    """The beta transcription session object with its `client_secret`."""

    id: str
    object: Literal["realtime.transcription_session"] = "realtime.transcription_session"
    client_secret: BetaClientSecret
    input_audio_format: str
    input_audio_transcription: dict[str, Any]
    turn_detection: dict[str, Any] | None
    modalities: list[str]
    input_audio_noise_reduction: dict[str, Any] | None = None
    include: list[str] | None = None
