"""/v1/audio/transcriptions, /v1/audio/sessions and the websocket /v1/audio/live.

Routes parse and validate, hand numpy PCM to the SpeechService (audio/speech.py) and render its
Transcript; every model touch happens there, as tasks on the shared driver loop.
"""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any, AsyncGenerator

import anyio
from litestar import Request, Response, WebSocket, delete, post, websocket
from litestar.enums import RequestEncodingType
from litestar.exceptions import WebSocketDisconnect
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import Body

from audio.formats import media_type, render
from audio.pcm import AudioInputError, decode_container, decode_raw_pcm, is_raw_pcm, parse_pcm_content_type
from audio.sessions import LiveSession, SessionClosed, SessionNotFound
from audio.transcript import Segment, TranscribeOptions, Transcript
from audio.whisper import WhisperCheckpointError
from engine.tasks import TaskRejected
from service.app import AppState, get_state
from service.audio_schemas import (
    LiveEvent,
    SessionAudioAccepted,
    SessionCreated,
    SessionCreateRequest,
    SessionDeleted,
    SessionFinished,
    TranscriptionForm,
    TranscriptionSegment,
    TranscriptTextDelta,
    TranscriptTextDone,
)
from service.errors import APIError, model_not_found
from service.schemas import ErrorResponse
from service.sse import ClientDisconnected, EventSource, SSEStream, run_while_connected

__all__ = ["ROUTES", "MAX_FILE_BYTES", "MAX_CHUNK_BYTES", "speech_error"]

MAX_FILE_BYTES = 25 * 1024 * 1024  # OpenAI's upload limit
MAX_CHUNK_BYTES = 8 * 1024 * 1024
_GENERIC_NAMES = {"whisper-1", "whisper", "tiny.en", "whisper-tiny.en"}
_ERRORS = {
    code: ResponseSpec(data_container=ErrorResponse, description=text, generate_examples=False)
    for code, text in ((400, "Bad audio or parameters (OpenAI error shape)"), (404, "Unknown model or session"),
                       (409, "Session finished, deleted or expired"), (413, "Body over the size limit"))
}


def speech_error(exc: BaseException) -> APIError:
    """Map speech-layer exceptions to OpenAI-shaped API errors. Raises nothing."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, AudioInputError):
        return APIError(400, exc.message, param=exc.param, code=exc.code)
    if isinstance(exc, SessionNotFound):
        return APIError(404, str(exc), param="session_id", code=exc.code)
    if isinstance(exc, SessionClosed):
        return APIError(409, str(exc), code=exc.code)
    if isinstance(exc, TaskRejected):
        return APIError(503, "The server is shutting down or the request was cancelled.", code="unavailable")
    if isinstance(exc, WhisperCheckpointError):
        return APIError(503, f"The Whisper model could not be loaded: {exc}", type="server_error", code="model_load_failed")
    if isinstance(exc, ValueError):
        return APIError(400, str(exc), code="invalid_value")
    return APIError(500, "The server had an error while transcribing.", type="server_error")


def _speech(state: AppState, model: str | None) -> Any:
    speech = getattr(state, "speech", None)
    if speech is None:
        raise APIError(404, "This server serves no Whisper model (start it with --whisper-model).",
                       param="model", code="model_not_found")
    names = {speech.model_name, *_GENERIC_NAMES, *getattr(state, "speech_aliases", set())}
    if model and model not in names:
        raise model_not_found(model, [speech.model_name])
    return speech


def _options(speech: Any, **kwargs: Any) -> TranscribeOptions:
    try:
        return speech.options(**kwargs)
    except ValueError as exc:
        param = "language" if "language" in str(exc) else "task"
        raise APIError(400, str(exc), param=param, code="invalid_value") from None


def _segments(t: Transcript) -> list[TranscriptionSegment]:
    return [TranscriptionSegment(**s.as_dict(with_words=False)) for s in t.segments]


def _decode_upload(raw: bytes, content_type: str | None) -> Any:
    if is_raw_pcm(content_type) and (content_type or "").startswith(("audio/pcm", "audio/l16", "audio/raw")):
        return decode_raw_pcm(raw, parse_pcm_content_type(content_type))
    return decode_container(raw, param="file")


@post("/v1/audio/transcriptions", status_code=200, request_max_body_size=MAX_FILE_BYTES, tags=["audio"],
      summary="Transcribe an audio file", responses=_ERRORS,
      description="OpenAI-compatible. `stream=true` answers text/event-stream: `transcript.text.delta` events "
                  "(one per decoded window), then `transcript.text.done`.")
async def create_transcription(
    request: Request[Any, Any, Any],
    data: Annotated[TranscriptionForm, Body(media_type=RequestEncodingType.MULTI_PART)],
) -> Response[Any]:
    """Raises APIError (400 bad audio/params, 404 model, 413 size, 503 load failure)."""
    state = get_state(request)
    speech = _speech(state, data.model)
    options = _options(speech, language=data.language, task=data.task, prompt=data.prompt or None,
                       temperatures=TranscribeOptions.ladder(data.temperature),
                       word_timestamps="word" in data.timestamp_granularities, vad=data.vad, vad_trim=data.vad_trim)
    raw = await data.file.read()
    try:
        pcm = await anyio.to_thread.run_sync(_decode_upload, raw, data.file.content_type)
    except AudioInputError as exc:
        raise speech_error(exc) from None
    if data.stream:
        return SSEStream(EventSource(_transcription_events(speech, pcm, options)))  # type: ignore[return-value]
    try:
        transcript = await run_while_connected(request, lambda: speech.transcribe(pcm, options))
    except ClientDisconnected:
        return Response(None, status_code=499)
    except Exception as exc:
        raise speech_error(exc) from None
    body = render(transcript, data.response_format, words="word" in data.timestamp_granularities)
    return Response(body, media_type=media_type(data.response_format), status_code=200)


async def _transcription_events(speech: Any, pcm: Any, options: TranscribeOptions) -> AsyncGenerator[bytes, None]:
    stream = speech.transcribe_stream(pcm, options)
    try:
        async for item in stream:
            if isinstance(item, Transcript):
                yield _sse(TranscriptTextDone(text=item.text))
            else:
                delta = "".join(s.text for s in item)
                if delta:
                    yield _sse(TranscriptTextDelta(delta=delta))
    except Exception as exc:
        err = speech_error(exc)
        body = {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}}
        yield f"data: {json.dumps(body)}\n\n".encode()
    finally:
        await stream.aclose()


def _sse(event: Any) -> bytes:
    return f"data: {event.model_dump_json()}\n\n".encode()


# ---- sessions ---------------------------------------------------------------------------------


@post("/v1/audio/sessions", status_code=200, tags=["audio"], summary="Open a live dictation session",
      responses=_ERRORS)
async def create_session(request: Request[Any, Any, Any], data: SessionCreateRequest) -> SessionCreated:
    """Raises APIError (400 bad options, 404 no Whisper model, 409 too many sessions)."""
    speech = _speech(get_state(request), data.model)
    prompt = " ".join(p for p in [data.prompt or "", ", ".join(w.strip() for w in data.vocabulary if w.strip())] if p)
    options = _options(speech, language=data.language, task=data.task, prompt=prompt or None,
                       temperatures=TranscribeOptions.ladder(data.temperature), vad=data.vad,
                       vad_min_speech_ms=data.vad_min_speech_ms)
    try:
        session = speech.create_session(options)
    except (SessionClosed, RuntimeError) as exc:
        raise APIError(409 if isinstance(exc, SessionClosed) else 503, str(exc), code="session_unavailable") from None
    return SessionCreated(id=session.id, model=speech.model_name)


def _session(request: Request[Any, Any, Any], session_id: str) -> tuple[Any, LiveSession]:
    speech = _speech(get_state(request), None)
    try:
        return speech, speech.get_session(session_id)
    except SessionNotFound as exc:
        raise speech_error(exc) from None


@post("/v1/audio/sessions/{session_id:str}/audio", status_code=200, request_max_body_size=MAX_CHUNK_BYTES,
      tags=["audio"], summary="Append audio to a session", responses=_ERRORS,
      description="Raw body. `content-type: audio/pcm;rate=N` is float32 little-endian mono (rate default "
                  "16000, 8000–48000 accepted, resampled), `;encoding=s16le` 16-bit; any other audio/* type "
                  "is decoded as a file. Audio accepted before a bad chunk is kept.")
async def append_session_audio(request: Request[Any, Any, Any], session_id: str) -> SessionAudioAccepted:
    """Raises APIError (400 bad chunk, 404 unknown session, 409 after finish, 413 too large)."""
    _, session = _session(request, session_id)
    body = await request.body()
    content_type = request.headers.get("content-type")
    try:
        if is_raw_pcm(content_type) or not content_type:
            session.append(body, parse_pcm_content_type(content_type if content_type and
                                                        not content_type.startswith("application/") else None))
        else:
            if session.closed:
                raise SessionClosed(f"session {session.id} is closed; no more audio accepted")
            session.append_samples(await anyio.to_thread.run_sync(functools.partial(decode_container, body, param="body")))
    except (AudioInputError, SessionClosed) as exc:
        raise speech_error(exc) from None
    return SessionAudioAccepted(id=session.id, received_seconds=round(session.received_seconds, 3),
                                windows_done=session.windows_done)


@post("/v1/audio/sessions/{session_id:str}/finish", status_code=200, tags=["audio"],
      summary="Finish a session and get its transcript", responses=_ERRORS)
async def finish_session(request: Request[Any, Any, Any], session_id: str) -> SessionFinished:
    """Raises APIError (404 unknown session, 409 deleted/expired, 503 load failure)."""
    _, session = _session(request, session_id)
    try:
        t = await session.finish()
    except Exception as exc:
        raise speech_error(exc) from None
    return SessionFinished(id=session.id, text=t.text, language=t.language, duration=round(t.duration, 3),
                           segments=_segments(t))


@delete("/v1/audio/sessions/{session_id:str}", status_code=200, tags=["audio"], summary="Delete a session",
        responses=_ERRORS)
async def delete_session(request: Request[Any, Any, Any], session_id: str) -> SessionDeleted:
    """Cancels the session: its queued windows never run. Raises APIError (404 unknown session)."""
    speech, _ = _session(request, session_id)
    speech.delete_session(session_id)
    return SessionDeleted(id=session_id)


# ---- websocket live ---------------------------------------------------------------------------


@websocket("/v1/audio/live")
async def live(socket: WebSocket[Any, Any, Any], language: str | None = None, rate: int = 16000,
               encoding: str = "f32le", interval: float = 1.0, vad: bool = False) -> None:
    """Binary messages: PCM chunks (`rate`, `encoding` query params); text `{"type":"finish"}` ends capture.
    Server sends `transcript.partial` {committed, tentative} about every `interval` s while audio flows, then
    `transcript.done` {text}. Errors arrive as `{"type":"error"}` before the socket closes."""
    await socket.accept()
    state = get_state(socket)  # type: ignore[arg-type]
    try:
        speech = _speech(state, None)
        fmt = parse_pcm_content_type(f"audio/pcm;rate={rate};encoding={encoding}")
        session = speech.create_session(_options(speech, language=language, vad=vad))
    except Exception as exc:
        await _send_error(socket, speech_error(exc))
        return
    await socket.send_json(LiveEvent(type="session.created", id=session.id).model_dump(exclude_none=True))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_partials, socket, session, max(0.2, interval))
            while True:
                message = await socket.receive()
                if message.get("type") == "websocket.disconnect":
                    raise WebSocketDisconnect(detail="client left")
                if message.get("bytes"):
                    try:
                        session.append(message["bytes"], fmt)
                    except AudioInputError as exc:
                        await _send_error(socket, speech_error(exc), close=False)
                        continue
                elif message.get("text") and json.loads(message["text"]).get("type") == "finish":
                    break
            tg.cancel_scope.cancel()
        t = await session.finish()
        await socket.send_json(LiveEvent(type="transcript.done", id=session.id, text=t.text,
                                         received_seconds=round(t.duration, 3),
                                         windows_done=session.windows_done).model_dump(exclude_none=True))
        await socket.close()
    except (WebSocketDisconnect, anyio.get_cancelled_exc_class()):
        raise
    except Exception as exc:
        await _send_error(socket, speech_error(exc))
    finally:
        speech.sessions.pop(session.id, None)
        session.cancel()


async def _partials(socket: WebSocket[Any, Any, Any], session: LiveSession, interval: float) -> None:
    seen = 0.0
    while True:
        await anyio.sleep(interval)  # pacing of tentative decodes, not synchronisation
        if session.received_seconds == seen:
            continue  # nothing new since the last partial
        seen = session.received_seconds
        tentative = await session.tentative()
        await socket.send_json(LiveEvent(type="transcript.partial", id=session.id, committed=session.committed_text(),
                                         tentative=tentative, received_seconds=round(session.received_seconds, 3),
                                         windows_done=session.windows_done).model_dump(exclude_none=True))


async def _send_error(socket: WebSocket[Any, Any, Any], err: APIError, close: bool = True) -> None:
    await socket.send_json({"type": "error", "message": err.message, "code": err.code, "param": err.param})
    if close:
        await socket.close(code=1008 if err.status < 500 else 1011)


ROUTES = [create_transcription, create_session, append_session_audio, finish_session, delete_session, live]
