"""Which Whisper model a speech request gets, its checked options, and how a request body becomes PCM.

One rule for audio bodies in every route: `audio/pcm`, `audio/l16` and `audio/raw` are raw PCM described
by the content-type's parameters, unless the body opens with a container's signature; anything else —
`application/octet-stream` included — is a container (WAV, mp3, m4a, flac, ogg, webm) that PyAV decodes and
identifies itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from audio.pcm import decode_container, decode_raw_pcm, parse_pcm_content_type, reads_as_raw_pcm
from audio.transcript import Segment, TranscribeOptions, Transcript
from audio.whisper import OPENAI_ALIASES
from service.http.errors import APIError, model_not_found, model_of_another_kind
from service.seams import SpeechBackend
from service.speech.schemas import TranscriptionSegment
from service.state import AppState

__all__ = ["speech_model_names", "served_speech", "transcribe_options", "decode_audio_body", "response_segments"]


def speech_model_names(state: AppState) -> set[str]:
    """Every name the served Whisper answers to (its own, OpenAI's ids, the CLI's); empty when none is served.
    Raises nothing."""
    speech = state.speech
    return {speech.model_name, *OPENAI_ALIASES, *state.speech_aliases} if speech is not None else set()


def served_speech(state: AppState, model: str | None, *, param: str = "model") -> SpeechBackend:
    """The speech service for `model` (None or "" = the served one; OpenAI's ids and the CLI's names work).
    `param`: where the model sits in the request, for the error (a live session's settings nest it).

    Raises APIError 404 model_not_found when no Whisper model is served or `model` is not it."""
    speech = state.speech
    if speech is None:
        raise APIError(404, "This server serves no Whisper model (it was started with --no-whisper, or found "
                            "none: start it without --no-whisper, or with --whisper-model MODEL).",
                       param=param, code="model_not_found")
    if model and model not in speech_model_names(state):
        chat = state.chat_model_name
        err = model_not_found(model, [speech.model_name])
        if chat is not None and model in {chat, *state.model_aliases}:
            err = model_of_another_kind(model, "a chat model (POST /v1/chat/completions)", speech.model_name)
        err.param = param
        raise err
    return speech


def transcribe_options(speech: SpeechBackend, **kwargs: Any) -> TranscribeOptions:
    """speech.options(**kwargs). Raises audio.errors.InvalidOption naming `language` or `task` (a 400)."""
    return speech.options(**kwargs)


def decode_audio_body(raw: bytes, content_type: str | None, *, param: str, max_seconds: float) -> np.ndarray:
    """A whole request body → 16 kHz mono float32, by the module's content-type rule, at most `max_seconds`
    long. Blocking (PyAV): run it in a worker thread. Raises audio.errors.AudioInputError with `param` (a 400)."""
    if reads_as_raw_pcm(content_type, raw):
        return decode_raw_pcm(raw, parse_pcm_content_type(content_type), param=param, max_seconds=max_seconds)
    return decode_container(raw, param=param, max_seconds=max_seconds)


def response_segments(transcript: Transcript) -> list[TranscriptionSegment]:
    """The transcript's segments as the API returns them (no word lists). Raises nothing."""
    return [_segment(s) for s in transcript.segments]


def _segment(segment: Segment) -> TranscriptionSegment:
    return TranscriptionSegment(**segment.as_dict(with_words=False))
