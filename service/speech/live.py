"""The websocket /v1/audio/live: PCM chunks in; committed and tentative text out while audio flows."""

from __future__ import annotations

import json
from typing import Any

import anyio
from litestar import WebSocket, websocket
from litestar.exceptions import WebSocketDisconnect

from audio.errors import AudioInputError
from audio.pcm import SAMPLE_RATE, parse_pcm_content_type
from audio.sessions import LiveSession
from service.http.errors import APIError, api_error
from service.speech.schemas import LiveEvent
from service.speech.served import served_speech, transcribe_options
from service.state import get_state

__all__ = ["live"]


@websocket("/v1/audio/live")
async def live(socket: WebSocket[Any, Any, Any], language: str | None = None, rate: int = SAMPLE_RATE,
               encoding: str = "f32le", interval: float = 1.0, vad: bool = False) -> None:
    """Binary messages: PCM chunks (`rate`, `encoding` query params); text `{"type":"finish"}` ends capture.
    Server sends `transcript.partial` {committed, tentative} about every `interval` s while audio flows, then
    `transcript.done` {text}. Errors arrive as `{"type":"error"}` before the socket closes."""
    await socket.accept()
    try:
        speech = served_speech(get_state(socket), None)
        fmt = parse_pcm_content_type(f"audio/pcm;rate={rate};encoding={encoding}")
        session = speech.create_session(transcribe_options(speech, language=language, vad=vad))
    except Exception as exc:
        await _send_error(socket, api_error(exc))
        return
    await socket.send_json(LiveEvent(type="session.created", id=session.id).model_dump(exclude_none=True))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_partials, socket, session, max(0.2, interval))
            while True:
                message: dict[str, Any] = dict(await socket.receive())
                if message.get("type") == "websocket.disconnect":
                    raise WebSocketDisconnect(detail="client left")
                if message.get("bytes"):
                    try:
                        session.append(message["bytes"], fmt)
                    except AudioInputError as exc:
                        await _send_error(socket, api_error(exc), close=False)
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
        await _send_error(socket, api_error(exc))
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
