"""Live dictation over plain HTTP: open a session, append audio chunks as they are captured, finish for
the transcript, or delete. Windows decode in the background while audio keeps arriving."""

from __future__ import annotations

from typing import Any

from litestar import Request, delete, post

from audio.errors import SessionClosed, SessionNotFound
from audio.formats import text_language
from audio.pcm import SAMPLE_RATE, parse_pcm_content_type, reads_as_raw_pcm
from audio.sessions import LiveSession
from audio.transcript import TranscribeOptions
from service.http.auth import client_key
from service.http.openapi import raw_body_operation
from service.seams import SpeechBackend
from service.speech.live_audio import append_container_counted, append_counted, count_live_audio, count_tails
from service.speech.session_schemas import (
    SessionAudioAccepted,
    SessionCreated,
    SessionCreateRequest,
    SessionDeleted,
    SessionFinished,
)
from service.speech.served import response_segments, served_speech, transcribe_options
from service.speech.transcriptions import SPEECH_ERRORS
from service.state import get_state

__all__ = ["create_session", "append_session_audio", "finish_session", "delete_session"]
# A chunk sent without a content-type is what the route documents as its default: float32 PCM at 16 kHz.
_DEFAULT_CHUNK_TYPE = "audio/pcm"


@post("/v1/audio/sessions", status_code=200, tags=["audio"], summary="Open a live dictation session",
      responses=SPEECH_ERRORS)
async def create_session(request: Request[Any, Any, Any], data: SessionCreateRequest) -> SessionCreated:
    """Raises APIError (400 bad options, 404 no Whisper model, 429 too many sessions, 503 not running)."""
    state = get_state(request)
    speech = served_speech(state, data.model)
    vocabulary = ", ".join(w.strip() for w in data.vocabulary if w.strip())
    prompt = " ".join(p for p in [data.prompt or "", vocabulary] if p)
    options = transcribe_options(speech, language=data.language, task=data.task, prompt=prompt or None,
                                 temperatures=TranscribeOptions.ladder(data.temperature), vad=data.vad,
                                 vad_min_speech_ms=data.vad_min_speech_ms, vad_min_silence_ms=data.vad_min_silence_ms)
    owner = client_key(request)
    session = speech.create_session(options, owner=owner)  # with keys, each key holds its share at most
    count_tails(state, session)
    return SessionCreated(id=session.id, model=speech.model_name)


def _session(request: Request[Any, Any, Any], session_id: str) -> tuple[SpeechBackend, LiveSession]:
    """The session `session_id` if the caller's key created it. Raises SessionNotFound otherwise (another
    key's session is not even confirmed to exist)."""
    state = get_state(request)
    speech = served_speech(state, None)
    session = speech.get_session(session_id)
    if state.config.api_keys and session.owner != client_key(request):
        raise SessionNotFound(f"no audio session {session_id!r} (unknown, deleted or expired)")
    return speech, session


_CHUNK_BODY = raw_body_operation({
    "audio/pcm": f"Raw PCM. Parameters: rate=8000..48000 (default {SAMPLE_RATE}), encoding=f32le (default), s16le, "
                 "s16be, ulaw or alaw, channels=1..8 (averaged to mono); e.g. `audio/pcm;rate=48000;encoding=s16le`.",
    "audio/l16": "Raw 16-bit big-endian PCM (`audio/L16;rate=N`, RFC 2586), same parameters.",
    "audio/pcmu": "G.711 μ-law, one byte a sample (telephony; `audio/basic`, `audio/x-mulaw`, `audio/mulaw` too), "
                  "rate default 8000, rate and channels as audio/pcm's (an `encoding` other than its own is refused); "
                  "`audio/pcma` (`audio/x-alaw`, `audio/alaw`) is A-law.",
    "audio/webm": "A piece of a browser's MediaRecorder stream (`recorder.start(250)`: WebM from Chrome, "
                  "`audio/ogg` from Firefox, fragmented `audio/mp4` from Safari): the first chunk carries the "
                  "container's header, each later one continues it and is decoded as it arrives.",
    "audio/wav": "A whole audio file (WAV, mp3, m4a, flac, ogg, webm: any container PyAV reads), or the start of a WAV "
                 "or .au recording written to a pipe: its header, the samples after it in the next chunks.",
    "application/octet-stream": "A whole audio file, identified from its own header.",
}, "One chunk of captured audio (raw PCM described by the content type's parameters, a whole file, or a piece of a "
   "container stream).", "SessionAudioOperation")


@post("/v1/audio/sessions/{session_id:str}/audio", status_code=200, tags=["audio"],
      summary="Append audio to a session", responses=SPEECH_ERRORS, operation_class=_CHUNK_BODY,
      description=f"Raw body. `content-type: audio/pcm;rate=N` (the default when absent) is float32 "
                  f"little-endian mono (rate default {SAMPLE_RATE}, 8000–48000 accepted, resampled), "
                  "`;encoding=s16le` 16-bit; `audio/pcmu` (or `audio/basic`, `audio/x-mulaw`, `audio/mulaw`) and "
                  "`audio/pcma` (or `audio/x-alaw`, `audio/alaw`) are G.711 μ-law and A-law, 8000 Hz unless `rate` "
                  "says otherwise; any other type (audio/wav, audio/webm, application/octet-stream, ...), or a body "
                  "that opens with a container's header whatever its type, is a container: a chunk with a header "
                  "starts a new stream (the one before ends there), and a WebM, Ogg or fragmented-MP4 stream is "
                  "decoded as it arrives, so that the headerless chunks a MediaRecorder gives after its first "
                  "(`recorder.start(250)`, each POSTed with the blob's type) continue it; other files are decoded "
                  "whole. A WAV or Sun .au header whose samples go on past its chunk (a recorder writing to a pipe: "
                  "`arecord -t wav -`, `ffmpeg … -f wav -`) makes the chunks after it PCM in the format the header "
                  "gives, whatever their content type, up to the length it declares (a new header starts the next). "
                  "A headerless container chunk with no stream open is refused (`missing_stream_header`). "
                  "Audio accepted before a bad chunk is kept. A chunk refused with `Retry-After` (429) is sent again "
                  "as it was: its audio, decoded once, waits for it (a stream never takes the same bytes twice); a "
                  "refusal no retry gets past ends the stream, and so does a stream whose chunks stop giving audio "
                  "(sent twice, out of order or left out: a 400), or give none in their first MiB.")
async def append_session_audio(request: Request[Any, Any, Any], session_id: str) -> SessionAudioAccepted:
    """Raises APIError (400 bad chunk, 404 unknown session, 409 after finish, 413 too large)."""
    _, session = _session(request, session_id)
    state = get_state(request)
    body = await request.body()
    content_type = request.headers.get("content-type") or _DEFAULT_CHUNK_TYPE
    # A WAV / .au header whose samples go on past its chunk (`arecord -t wav -` POSTed in pieces): the chunks after it
    # are PCM in its format, whatever their type says (audio/piped_pcm.py). A closed session's chunk goes on below,
    # to be refused as what it is.
    rest: bytes | None = body
    taken = 0.0
    if not session.closed:  # `piped` held through its call: with --isolate a proxy let go of at once is released
        piped = session.piped
        rest, taken = piped.feed(body)  # plain values in and out: they cross --isolate's engine connection
    count_live_audio(state, taken)
    if rest is None:  # taken (or a header cut short, waiting for the rest)
        pass
    elif reads_as_raw_pcm(content_type, rest):  # the file route's rule: a body with a container's header is one
        # Raw chunks go through the session's resampler, whose filter state spans chunks.
        append_counted(state, session, rest, parse_pcm_content_type(content_type))
    else:
        if session.closed:  # refuse before spending a worker thread decoding a whole file
            raise SessionClosed(f"session {session.id} is closed; no more audio accepted")
        # decoded in a worker thread, a stream's pieces as they come (audio/container_chunks.py)
        await append_container_counted(state, session, rest)
    return SessionAudioAccepted(id=session.id, received_seconds=round(session.received_seconds, 3),
                                windows_done=session.windows_done, lag_seconds=session.lag_seconds)


@post("/v1/audio/sessions/{session_id:str}/finish", status_code=200, tags=["audio"],
      summary="Finish a session and get its transcript", responses=SPEECH_ERRORS)
async def finish_session(request: Request[Any, Any, Any], session_id: str) -> SessionFinished:
    """Raises APIError (404 unknown session, 409 deleted/expired, 503 load failure)."""
    _, session = _session(request, session_id)
    t = await session.finish()
    # without Whisper's leading space, as /v1/audio/transcriptions gives a text
    # the language by name, as verbose_json gives it ("english", not "en")
    return SessionFinished(id=session.id, text=t.text.lstrip(), language=text_language(t),
                           duration=round(t.duration, 3), segments=response_segments(t))


@delete("/v1/audio/sessions/{session_id:str}", status_code=200, tags=["audio"], summary="Delete a session",
        responses=SPEECH_ERRORS)
async def delete_session(request: Request[Any, Any, Any], session_id: str) -> SessionDeleted:
    """Cancels the session: its queued windows never run. Raises APIError (404 unknown session)."""
    speech, _ = _session(request, session_id)
    speech.delete_session(session_id)
    return SessionDeleted(id=session_id)
