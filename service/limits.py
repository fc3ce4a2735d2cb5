"""Limits: how much one request, connection or frame may take, and how long a client may stall. Each is a
`tandem serve` flag (service/cli/serve_limits.py) with the default here, and /stats shows them all.

They bound what a single client can cost everyone else: memory (bodies, parts, chunks, frames), time on
shared slots (slow bodies, template rendering) and parser recursion (JSON depth).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["Limits", "MiB"]

MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Per-request limits. Sizes in bytes, times in seconds."""

    # A JSON request body (chat, completions, sessions): an agent's 128k-token conversation is ~1 MB.
    max_body_bytes: int = 8 * MiB
    # A multipart upload as a whole (/v1/audio/transcriptions), and any one part of it (OpenAI: 25 MB files).
    max_upload_bytes: int = 26 * MiB
    max_part_bytes: int = 25 * MiB
    # The longest audio one transcription request or session chunk may decode to (2 h is ~460 MB at 16 kHz;
    # a few MB of compressed silence can claim days).
    max_audio_seconds: float = 7200.0
    # One raw audio chunk appended to a live session over HTTP.
    max_pcm_chunk_bytes: int = 8 * MiB
    # One websocket message (/v1/realtime, /v1/audio/live). OpenAI allows an input_audio_buffer.append of 15 MiB,
    # and granian drops a connection on a frame over 16 MiB, so every frame it carries is taken here. A larger
    # (fragmented) message is dropped unread with an error event; the session stays. What an append may cost after
    # this: its ≤12 MiB of PCM, refused before decoding when past the session's backlog cap (120 s by default).
    max_ws_frame_bytes: int = 16 * MiB
    # A connection must finish its request headers in this time (granian's HTTP/1 header read timeout).
    header_timeout: float = 10.0
    # A request body may go this long without a byte arriving before the request is answered 408.
    body_timeout: float = 30.0
    # A streamed response may wait this long for its client to read before it is ended and its generation stopped
    # (a client that stopped reading held its row to max_tokens).
    send_timeout: float = 60.0
    # Arrays/objects nested deeper than this are refused with a 400 before they are decoded.
    max_json_depth: int = 64
    # The chat template must render within this time (it is aborted after it, or when the client leaves).
    render_timeout: float = 10.0
    # Connections one worker serves at once; more wait in the listen backlog (granian's backpressure).
    max_connections: int = 4096

    def as_dict(self) -> dict[str, Any]:
        """The limits as plain values (for /stats). Raises nothing."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> "Limits":
        """Limits from a dict (unknown keys ignored). Raises TypeError for values of the wrong kind."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in (values or {}).items() if k in known})

    def check(self) -> None:
        """Raises ValueError naming the first limit that is not positive."""
        for f in dataclasses.fields(self):
            if not getattr(self, f.name) > 0:
                raise ValueError(f"{f.name} must be > 0, got {getattr(self, f.name)!r}")
