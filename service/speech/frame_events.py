"""The server events of `/v1/audio/live`'s binary-frame mode (simple clients: raw PCM frames in, text snapshots out)
and the session each live socket announces first, in the shape its client reads."""

from __future__ import annotations

from typing import Any

from audio.pcm import PcmFormat
from audio.sessions import LiveSession
from audio.transcript import Transcript
from service.speech.realtime_config import Dialect, RealtimeConfig

__all__ = ["created_event", "partial_event", "done_event"]


def created_event(config: RealtimeConfig, realtime: bool, dialect: Dialect, session_id: str, model: str,
                  frame_format: PcmFormat) -> dict[str, Any]:
    """The first event: beta's `transcription_session.created`, else GA's `session.created` with `id` (what
    binary-frame clients read) and, for them, the format their frames are read as (JSON appends keep the Realtime
    format). Raises nothing."""
    if realtime and dialect == "beta":
        return {"type": "transcription_session.created", "session": config.session_object("beta", session_id, model)}
    session = config.session_object("ga", session_id, model)
    if not realtime:
        session["audio"]["input"]["format"] = {"type": "audio/pcm", "rate": frame_format.rate,
                                               "encoding": frame_format.encoding}
    return {"type": "session.created", "id": session_id, "session": session}


def partial_event(session: LiveSession, committed: str, guess: str) -> dict[str, Any]:
    """A snapshot of the text (`committed`, then the tentative `guess`), without Whisper's leading space as the final
    text: committed grows into it, the guess follows it. Raises nothing."""
    committed = committed.lstrip()
    return {"type": "transcript.partial", "id": session.id, "committed": committed,
            "tentative": guess if committed else guess.lstrip(), "received_seconds": round(session.received_seconds, 3),
            "windows_done": session.windows_done, "lag_seconds": session.lag_seconds}


def done_event(session: LiveSession, transcript: Transcript) -> dict[str, Any]:
    """The final transcript of a finished session. Raises nothing."""
    return {"type": "transcript.done", "id": session.id, "text": transcript.text.lstrip(),
            "received_seconds": round(transcript.duration, 3), "windows_done": session.windows_done}
