"""PipedPcm — which of one live input's chunks are a WAV or Sun .au header and the PCM after it, for both live routes
(/v1/audio/live's binary frames, the chunks POSTed to /v1/audio/sessions/{id}/audio).

A recorder writing to a pipe (`arecord -t wav -`, `ffmpeg … -f wav -`) sends a header, often of unknown size, then the
samples. A chunk that opens with such a header (or holds the rest of one the chunk before cut short) whose samples go
on past it makes the chunks after it PCM in the format the header gives, whatever the route was told (the header is
the recording's own word), up to the length it declares (audio/pcm_headers.py HeadedPcm); a chunk that opens with a
container's header (a new WAV, a WebM...) ends it, and ends a header left unfinished (dropped: its recorder is gone).
A header whole in its chunk is a file: left to the caller, as any other container's chunk and the chunks before a
header are. A first piece too short to hold a signature (`RIFF` of `RIFF....WAVE`) waits for the rest, at most 12 bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from audio.container_chunks import opens_stream
from audio.containers import container_kind, signature_start
from audio.errors import AudioInputError
from audio.pcm import PcmFormat
from audio.pcm_headers import HEADED_KINDS, HeadedPcm, pcm_header

__all__ = ["PipedPcm"]


class PipedPcm:
    """One input's header state, chunk by chunk (see the module doc); `param` names the audio in its errors. Not
    thread-safe: call it from the event loop, in the order the chunks came."""

    def __init__(self, param: str = "body", into: Callable[[bytes, PcmFormat], object] | None = None) -> None:
        self._param = param
        self._into = into  # where `feed` appends (a session's own append)
        # the samples after a header go on (its refusal: each of its chunks is refused with it)
        self._headed: HeadedPcm | AudioInputError | None = None
        self._head = b""  # a header (or a signature) cut short by its chunk: the next one has the rest
        self._again: tuple[bytes, bytes] | None = None  # the last chunk's digest and the rest returned of it

    def feed(self, chunk: bytes) -> tuple[bytes | None, float]:
        """`take` into the append given at construction: returns what `take` returns and the seconds of audio taken.
        Plain values in and out, so the HTTP route of an `--isolate` API process can call it on a session living in
        the engine process (a callback cannot cross that connection). Raises as `take` does."""
        into = self._into
        assert into is not None, "a PipedPcm made without `into`"
        taken = 0.0

        def append(pcm: bytes, fmt: PcmFormat) -> None:
            nonlocal taken
            into(pcm, fmt)
            taken += fmt.seconds(len(pcm))
        return self.take(chunk, append), taken

    def take(self, chunk: bytes, append: Callable[[bytes, PcmFormat], object]) -> bytes | None:
        """Take `chunk` when it is a header or samples after one: its whole samples go to `append` in the header's
        format (a partial one, a header or a signature cut short, waits for the next chunk), and None is returned.
        Otherwise returns what the caller reads as it would: `chunk` (a container's chunk, PCM with no header before
        it), or a whole file (with the start of its header the chunk before held back), or what follows a WAV's end
        in it. Raises AudioInputError naming `param`: a header that cannot be read, or a chunk of samples PcmFormat
        cannot read (each after such a header); or what `append` raises, the state then as before the chunk (it may
        be sent again). The same chunk again right after one whose rest this returned (the caller refused that rest:
        its retry) returns that rest again, its samples taken once."""
        again, self._again = self._again, None
        if again is not None and again[0] == _digest(chunk):
            self._again = again
            return again[1]
        head, headed = self._head, self._headed
        if head and opens_stream(chunk):  # a header left unfinished (its recorder gone) ends where a stream starts
            head = b""
        if head or container_kind(chunk) in HEADED_KINDS:
            body = head + chunk
            if container_kind(body) not in HEADED_KINDS:  # a signature's start held back: the rest came
                self._head = body if signature_start(body) else b""
                return None if self._head else self._returned(chunk, body)
            try:
                header = pcm_header(body, self._param)
            except AudioInputError as exc:  # the chunks after it are no PCM of the format before: refused too
                self._head, self._headed = b"", exc
                raise
            if header is None:  # the header goes on in the next chunk
                self._head = body
                return None
            if header.whole_in(body):  # a whole file: FFmpeg reads it as any container, whatever its samples
                self._head, self._headed = b"", None
                return self._returned(chunk, body)
            try:  # a recording's start: its samples go on in the chunks after this one
                headed = HeadedPcm(header, self._param)
            except AudioInputError as exc:
                headed = exc
            samples = body[header.offset:]
        elif headed is None:
            if signature_start(chunk):  # a pipe's first read may end inside a signature: wait for its rest
                self._head = chunk
                return None
            self._head = b""
            return chunk
        elif opens_stream(chunk):  # another container's stream, or file, begins
            self._head, self._headed = b"", None
            return chunk
        else:
            samples = chunk
        if isinstance(headed, AudioInputError):  # samples it cannot read: each of its chunks is refused
            self._head, self._headed = b"", headed
            raise AudioInputError(headed.message, param=headed.param, code=headed.code)
        past = headed.feed(samples, lambda pcm: append(pcm, headed.format))  # raises: nothing here changed yet
        self._head, self._headed = b"", None if headed.over else headed
        # the file ended (a WAV's RIFF size): what follows is read as it would be with none before
        return self._returned(chunk, past) if headed.over and past else None

    def _returned(self, chunk: bytes, rest: bytes) -> bytes:
        """`rest`, what the caller reads of `chunk`, kept for its retry when it is not `chunk` as it came."""
        if rest is not chunk:
            self._again = (_digest(chunk), rest)
        return rest


def _digest(chunk: bytes) -> bytes:
    return hashlib.blake2b(chunk, digest_size=16).digest()
