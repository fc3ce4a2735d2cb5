"""How a live socket's audio reaches its session: raw PCM in the format its client declared, or a browser's
MediaRecorder stream sent as binary frames.

A binary frame that opens with a container's header (audio/container_chunks.py: WebM from Chrome, Ogg from Firefox,
fragmented MP4 from Safari) starts a container stream, and from then on the socket's binary frames are that stream's
pieces, decoded as they arrive (a frame with a header starts the next stream); before one, binary frames are PCM.
"""

from __future__ import annotations

from audio.container_chunks import opens_stream
from audio.errors import AudioError
from audio.pcm import SAMPLE_RATE, PcmFormat
from audio.sessions import LiveSession
from service.http.errors import api_error
from service.state import AppState

__all__ = ["SocketAudio"]


class SocketAudio:
    """One socket's audio input (see the module doc)."""

    def __init__(self, state: AppState) -> None:
        self.state = state
        self.containers = False  # a container stream began: binary frames are its pieces

    async def frame(self, session: LiveSession, data: bytes, fmt: PcmFormat) -> None:
        """One binary frame: PCM in `fmt`, or a piece of a container stream. Raises APIError (a 400 naming
        `audio`: a bad frame, the audio before it kept; a cap's refusal; the session closed)."""
        if not (self.containers or opens_stream(data)):
            self.pcm(session, data, fmt)
            return
        self.containers = True
        try:
            samples = await session.append_container(data, max_seconds=self.state.config.limits.max_audio_seconds)
        except AudioError as exc:
            raise api_error(exc, params={"body": "audio"}) from None
        self._counted(samples / SAMPLE_RATE)

    def pcm(self, session: LiveSession, data: bytes, fmt: PcmFormat) -> None:
        """Raw PCM in `fmt` (a binary frame, or a Realtime append's audio). Raises APIError as frame()."""
        try:
            session.append(data, fmt)
        except AudioError as exc:  # the PCM checks name an HTTP body; here the audio is the event's `audio`, or
            raise api_error(exc, params={"body": "audio"}) from None  # a binary frame's (no body on a socket)
        self._counted(len(data) / (fmt.rate * fmt.sample_bytes * max(1, fmt.channels)))

    def _counted(self, seconds: float) -> None:
        # Counted as it is taken (refused audio raised above): /metrics shows live audio while sessions run.
        if (metrics := self.state.metrics) is not None:
            metrics.observe_live_audio(seconds)
