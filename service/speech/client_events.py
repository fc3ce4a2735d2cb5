"""What a live socket's text message says: a JSON object of a known type, and which way of talking it chooses.

`/v1/realtime` always talks OpenAI's Realtime events; `/v1/audio/live` does once one comes before any PCM frame or
`finish` (service/speech/live_socket.py), and after one of those it is a binary-frame socket for good.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from service.http.errors import APIError
from service.http.json_body import json_depth

__all__ = ["Mode", "REALTIME_CLIENT_EVENTS", "UNSUPPORTED_PREFIXES", "decoded_event", "decided_mode",
           "frames_refusal"]

Mode = Literal["undecided", "frames", "realtime"]
REALTIME_CLIENT_EVENTS = frozenset({"session.update", "transcription_session.update", "input_audio_buffer.append",
                                    "input_audio_buffer.commit", "input_audio_buffer.clear"})
# A Realtime conversation's client events: named as not available here, not as unknown.
UNSUPPORTED_PREFIXES = ("conversation.", "response.", "output_audio_buffer.")


def decoded_event(text: str, depth_limit: int) -> dict[str, Any]:
    """The message as a JSON object. Raises APIError 400: nested past `depth_limit`, not JSON, not an object."""
    if (depth := json_depth(text.encode())) > depth_limit:
        raise APIError(400, f"The message nests {depth} levels deep; at most {depth_limit} are accepted.",
                       code="json_too_deep")
    try:
        event = json.loads(text)
    except (ValueError, RecursionError):
        raise APIError(400, "a text message must be a JSON object", code="invalid_json") from None
    if not isinstance(event, dict):
        raise APIError(400, "a text message must be a JSON object", code="invalid_event")
    return event


def decided_mode(mode: Mode, kind: Any) -> Mode:
    """The socket's way of talking after a message of type `kind`: the first Realtime event or `finish` decides an
    undecided one (an unknown type decides nothing). Raises nothing."""
    if mode == "undecided" and (kind in REALTIME_CLIENT_EVENTS or kind == "finish"):
        return "realtime" if kind in REALTIME_CLIENT_EVENTS else "frames"
    return mode


def frames_refusal(kind: Any, mode: Mode) -> APIError:
    """The error for a text message a socket not talking Realtime cannot take (all but `finish`). Raises nothing."""
    # A socket's first PCM frame or finish makes it a binary-frame one: its events are those, not Realtime's.
    late = kind in REALTIME_CLIENT_EVENTS and mode == "frames"
    return APIError(400, f"unknown message type {kind!r}; send binary PCM frames and {{\"type\": \"finish\"}}"
                    + (", or Realtime client events" if mode == "undecided" else "")
                    + (" (this socket speaks binary frames since its first message: Realtime events must come "
                       "before any PCM frame)" if late else ""),
                    param="type", code="unknown_event")
