"""How a live socket's audio reaches its session: raw PCM in the format its client declared, PCM after a WAV or
Sun .au header, or a browser's MediaRecorder stream sent as binary frames.

A binary frame that opens with a container's header (audio/container_chunks.py: WebM from Chrome, Ogg from Firefox,
fragmented MP4 from Safari) starts a container stream, and from then on the socket's binary frames are that stream's
pieces, decoded as they arrive (a frame with a header starts the next stream); before one, binary frames are PCM.
A WAV or .au header whose samples go on past its frame (a recorder writing to a pipe: `arecord -t wav -`, `ffmpeg …
-f wav -`) makes the frames after it PCM in the format the header gives, whatever the query announced (the header
is the recording's own word), up to the length it declares (audio/pcm_headers.py); one whole in its frame is a file,
decoded as the container frames are.
"""

from __future__ import annotations

from audio.container_chunks import opens_stream
from audio.containers import container_kind
from audio.errors import AudioError, AudioInputError
from audio.pcm import SAMPLE_RATE, PcmFormat
from audio.pcm_headers import HEADED_KINDS, HeadedPcm, pcm_header
from audio.sessions import LiveSession
from service.http.errors import api_error
from service.state import AppState

__all__ = ["SocketAudio"]


class SocketAudio:
    """One socket's audio input (see the module doc)."""

    def __init__(self, state: AppState) -> None:
        self.state = state
        self.containers = False  # a container stream began: binary frames are its pieces
        # a WAV / .au header's samples go on: binary frames are PCM in its format (its refusal: each is refused)
        self._headed: HeadedPcm | AudioInputError | None = None
        self._head = b""  # a header cut short by its frame: the next frame has the rest

    async def frame(self, session: LiveSession, data: bytes, fmt: PcmFormat) -> None:
        """One binary frame: PCM in `fmt`, or in the format of the WAV / .au header before it, or a piece of a
        container stream. Raises APIError (a 400 naming `audio`: a bad frame, the audio before it kept; a cap's
        refusal; the session closed)."""
        if self._head or container_kind(data) in HEADED_KINDS:
            data, self._head = self._head + data, b""
            try:
                header = pcm_header(data, "audio")
            except AudioInputError as exc:  # the frames after it are no PCM of the format before: refused too
                self.containers, self._headed = False, exc
                raise api_error(exc) from None
            if header is None:  # the header goes on in the next frame
                self._head = data
                return
            if not header.whole_in(data):  # a recording's start: its samples go on in the frames after this one
                self.containers = False
                try:
                    self._headed = HeadedPcm(header, "audio")
                except AudioInputError as exc:
                    self._headed = exc
                self._samples(session, data[header.offset:])
                return
            self._headed = None  # a whole file: FFmpeg reads it as the container frames, whatever its samples
        elif self._headed is not None and not opens_stream(data):
            self._samples(session, data)
            return
        if not (self.containers or opens_stream(data)):
            self.pcm(session, data, fmt)
            return
        self.containers, self._headed = True, None
        try:
            samples = await session.append_container(data, max_seconds=self.state.config.limits.max_audio_seconds)
        except AudioError as exc:
            raise api_error(exc, params={"body": "audio"}) from None
        self._counted(samples / SAMPLE_RATE)

    def _samples(self, session: LiveSession, data: bytes) -> None:
        """A piece of the samples after a WAV / .au header. Raises APIError as frame()."""
        headed = self._headed
        if isinstance(headed, AudioInputError):  # samples it cannot read: each of its frames is refused
            raise api_error(headed) from None
        assert headed is not None
        headed.feed(data, lambda pcm: self.pcm(session, pcm, headed.format))

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
