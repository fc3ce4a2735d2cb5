"""How a live socket's audio reaches its session: raw PCM in the format its client declared, PCM after a WAV or
Sun .au header, or a browser's MediaRecorder stream sent as binary frames.

A binary frame that opens with a container's header (audio/container_chunks.py: WebM from Chrome, Ogg from Firefox,
fragmented MP4 from Safari) starts a container stream, and from then on the socket's binary frames are that stream's
pieces, decoded as they arrive (a frame with a header starts the next stream); before one, binary frames are PCM.
A WAV or .au header whose samples go on past its frame (a recorder writing to a pipe: `arecord -t wav -`, `ffmpeg …
-f wav -`) makes the frames after it PCM in the format the header gives, whatever the query announced (the header
is the recording's own word), up to the length it declares (audio/piped_pcm.py, as the HTTP session route reads its
chunks); one whole in its frame is a file, decoded as the container frames are.
"""

from __future__ import annotations

from audio.container_chunks import opens_stream
from audio.errors import AudioError, AudioInputError
from audio.pcm import PcmFormat
from audio.piped_pcm import PipedPcm
from audio.sessions import LiveSession
from service.http.errors import api_error
from service.speech.live_audio import append_container_counted, append_counted
from service.state import AppState

__all__ = ["SocketAudio"]


class SocketAudio:
    """One socket's audio input (see the module doc)."""

    def __init__(self, state: AppState) -> None:
        self.state = state
        self.containers = False  # a container stream began: binary frames are its pieces
        self._piped = PipedPcm("audio")  # a WAV / .au header's samples go on: binary frames are PCM in its format

    async def frame(self, session: LiveSession, data: bytes, fmt: PcmFormat) -> None:
        """One binary frame: PCM in `fmt`, or in the format of the WAV / .au header before it, or a piece of a
        container stream. Raises APIError (a 400 naming `audio`: a bad frame, the audio before it kept; a cap's
        refusal; the session closed)."""
        try:
            rest = self._piped.take(data, lambda pcm, header_format: self.pcm(session, pcm, header_format))
        except AudioInputError as exc:  # a header that cannot be read, or samples after one that cannot be
            raise api_error(exc) from None
        if rest is None:  # a header, or PCM after one (until a frame opens a container: `containers` waits till then)
            return
        if not (self.containers or opens_stream(rest)):
            self.pcm(session, rest, fmt)
            return
        self.containers = True
        try:
            await append_container_counted(self.state, session, rest)
        except AudioError as exc:
            raise api_error(exc, params={"body": "audio"}) from None

    def pcm(self, session: LiveSession, data: bytes, fmt: PcmFormat) -> None:
        """Raw PCM in `fmt` (a binary frame, or a Realtime append's audio). Raises APIError as frame()."""
        try:
            append_counted(self.state, session, data, fmt)
        except AudioError as exc:  # the PCM checks name an HTTP body; here the audio is the event's `audio`, or
            raise api_error(exc, params={"body": "audio"}) from None  # a binary frame's (no body on a socket)
