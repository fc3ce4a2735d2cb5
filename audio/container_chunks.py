"""The container audio one live session receives, chunk by chunk: whole files, or the pieces of a stream.

The rule: a chunk that opens with a container's header (audio/containers.py's signature; for Ogg a page that begins
its stream, as each of a stream's pages opens with `OggS`) starts a new stream, the one before closed and its tail
taken first, in order. A WebM, Ogg or fragmented-MP4 stream is decoded as it arrives (audio/container_stream.py),
so a chunk with no header continues it; any other file (WAV, mp3, flac, a non-fragmented MP4 whose index may come
last...) is decoded whole, as /v1/audio/transcriptions does. A chunk with no header and no stream open is a clear 400:
it looks like a browser's MediaRecorder timeslice whose first chunk never came (unless FFmpeg reads it whole all the
same); one too short to tell its container by waits for the next (dropped when that one opens a stream itself, or
raw PCM or the end comes). A chunk the session refused (a cap) after its stream consumed it is held: its retry, the
same bytes, is taken from there, never fed twice (FFmpeg lost its place in the stream). A session's cancel races its
worker thread: the open stream is swapped under a lock, and none opens after.
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np

from audio.container_stream import CLOSE_TIMEOUT, STREAM_FORMATS, STREAM_NAMES, ContainerStream
from audio.containers import container_kind
from audio.errors import AudioInputError, AudioLimitExceeded, SessionClosed
from audio.pcm import decode_container

__all__ = ["ContainerChunks", "opens_stream"]

_OGG_BEGINS = 0x02  # an Ogg page's header-type flag for the first page of a logical stream
_FAILED = {"audio_too_long": "that decodes to more audio than it may bring"}  # why a stream ended, by its error
_SNIFF = 12  # bytes container_kind needs to tell any fixed signature (RIFF....WAVE)


def opens_stream(body: bytes) -> bool:
    """Whether `body` opens with a container's header, so that it starts a new stream (or is a whole file).
    Raises nothing."""
    kind = container_kind(body)
    return kind is not None and (kind != "ogg" or (len(body) > 5 and bool(body[5] & _OGG_BEGINS)))


def _fragmented_mp4(body: bytes) -> bool:
    """Whether an MP4 is fragmented (MediaRecorder's: `moov` with `mvex`, then `moof`/`mdat` pairs), so it can be
    read as it arrives; a plain one (its `mdat` before a `moov` with no `mvex`) is read whole. Raises nothing."""
    at = 0
    while at + 8 <= len(body):
        size, box = int.from_bytes(body[at:at + 4], "big"), body[at + 4:at + 8]
        if size == 1 and at + 16 <= len(body):  # a 64-bit size follows the type
            size = int.from_bytes(body[at + 8:at + 16], "big")
        if box == b"moof":
            return True
        if box == b"moov":  # cut short, it goes on in the next chunk: only a stream is sent so
            return at + size > len(body) or b"mvex" in body[at + 8:at + size]
        if box == b"mdat" or size < 8:
            return False
        at += size
    return True  # the header goes on in the next chunk: only a stream is sent so


class ContainerChunks:
    """One session's container chunks (see the module doc). decode, tail_before and close block (PyAV): call them
    from a worker thread, one at a time; abort, held and refused are for the event loop."""

    def __init__(self, param: str = "body") -> None:
        self._param = param
        self._lock = threading.Lock()  # over _stream and _aborted: abort() comes from the event loop
        self._stream: ContainerStream | None = None
        self._aborted = False  # the session is gone: no stream opens any more
        self._ended: str | None = None  # why no stream is open any more, for the next headerless chunk's error
        self._short = b""  # the start of a chunk too short to tell its container by, with no stream open
        self._held: tuple[bytes, np.ndarray] | None = None  # a refused chunk's digest and audio, for its retry

    @property
    def open(self) -> bool:
        """A stream is open: a chunk with no header continues it. Raises nothing."""
        return self._stream is not None

    def tail_before(self, body: bytes) -> np.ndarray:
        """When `body` starts a new stream, or is a whole file: close the open stream and return its tail (16 kHz),
        which comes before `body`'s audio. Else nothing. Raises nothing."""
        if self._stream is None or not opens_stream(body):
            return np.zeros(0, np.float32)
        return self.close()

    def decode(self, body: bytes, max_seconds: float | None = None) -> np.ndarray:
        """`body`'s audio at 16 kHz mono (for a stream, what it decoded so far). `max_seconds`: longer is refused.
        Raises AudioInputError (empty, corrupt, headerless with no stream open, too long), SessionClosed (after
        abort)."""
        if not body:
            raise AudioInputError("the audio chunk is empty", param=self._param, code="empty_audio")
        with self._lock:
            if self._aborted:
                raise SessionClosed("the session was closed; no more audio accepted")
            short, self._short = self._short, b""
            if self._stream is None:
                if opens_stream(body):  # a stream starts afresh: the short chunk before was a stray
                    short = b""
                body = short + body
                if len(body) < _SNIFF:
                    self._short = body  # the next chunk may complete its header
                    return np.zeros(0, np.float32)
            stream, starts = self._stream, opens_stream(body)
            if starts:
                if stream is not None:  # tail_before took its tail; a caller that did not loses it
                    stream.abort()
                kind = container_kind(body)
                assert kind is not None
                stream = self._stream = ContainerStream(kind, param=self._param) \
                    if kind in STREAM_FORMATS and (kind != "mp4" or _fragmented_mp4(body)) else None
                if stream is None:
                    self._ended = "its last chunk with a header was a whole file, not the start of a stream read in " \
                                  "pieces"
        if stream is not None:
            return self._fed(stream, body, max_seconds)
        if starts or container_kind(body) is None:  # FFmpeg may still know it whole (a format with no signature)
            try:
                return decode_container(body, param=self._param, max_seconds=max_seconds)
            except AudioInputError as exc:
                if starts or exc.code != "unsupported_or_corrupt_audio":
                    raise
        raise self._headerless(len(short))

    def held(self, body: bytes) -> np.ndarray | None:
        """The audio of the chunk refused last when `body` is that chunk again (its retry), else None: the refused
        audio is dropped, as its refusal said (the stream goes on from the bytes it consumed). Raises nothing."""
        held, self._held = self._held, None
        return held[1] if held is not None and held[0] == _digest(body) else None

    def refused(self, body: bytes, pcm: np.ndarray, exc: AudioLimitExceeded) -> AudioLimitExceeded:
        """The session refused `body`'s audio `pcm`, decoded already: held for the retry `exc` invites (Retry-After);
        a refusal no retry of the same bytes gets past ends the open stream (the client cannot send its bytes
        again in smaller chunks) and says so. Returns the error to raise. Raises nothing."""
        if exc.retry_after is not None:
            self._held = (_digest(body), pcm)
            return exc
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is None:
            return exc
        stream.abort()
        name = STREAM_NAMES[stream.kind]
        self._ended = f"its {name} stream ended at a chunk refused for a limit"
        return type(exc)(f"{exc.message}; the {name} stream ended with this chunk: start a new one with a chunk that "
                         "carries its header")

    def close(self, timeout: float = CLOSE_TIMEOUT) -> np.ndarray:
        """Close the open stream (none: nothing; a short chunk held is dropped: what comes next is no more its rest);
        returns its tail. Raises nothing."""
        with self._lock:
            stream, self._stream, self._short = self._stream, None, b""
            if stream is not None:
                self._ended = f"its {STREAM_NAMES[stream.kind]} stream was closed"
        return np.zeros(0, np.float32) if stream is None else stream.close(timeout)

    def abort(self) -> None:
        """Stop the open stream's decoder, its tail dropped, and open none again (the session is gone). Raises
        nothing."""
        with self._lock:
            self._aborted, self._held, self._short = True, None, b""
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.abort()

    def _fed(self, stream: ContainerStream, body: bytes, max_seconds: float | None) -> np.ndarray:
        try:
            pcm = stream.feed(body, max_seconds)
        except AudioInputError as exc:
            if self._aborted:  # abort() ended it under this feed
                raise SessionClosed("the session was closed; no more audio accepted") from None
            name = STREAM_NAMES[stream.kind]
            self._drop(stream, f"its {name} stream had ended" if exc.code == "stream_ended" else
                       f"its {name} stream ended at a chunk {_FAILED.get(exc.code, 'that could not be decoded')} "
                       f"({exc.message})")
            raise
        if stream.ended:  # its own end (FFmpeg read all of it): all its audio came out above
            self._drop(stream, f"its {STREAM_NAMES[stream.kind]} stream reached its end")
        return pcm

    def _drop(self, stream: ContainerStream, why: str) -> None:
        with self._lock:
            if self._stream is stream:
                self._stream, self._ended = None, why

    def _headerless(self, short: int = 0) -> AudioInputError:
        why = f" (no stream is open in this session: {self._ended})" if self._ended else ""
        joined = f", read after the {short} bytes of the short chunk before it," if short else ""
        return AudioInputError(
            f"the chunk{joined} opens with no container header and continues no stream: it looks like a headerless "
            f"continuation of a WebM, Ogg or MP4 stream (a MediaRecorder timeslice) whose first chunk, the one with "
            f"the header, was not received{why}. Send a recording's chunks in order from its first, or raw samples "
            "as audio/pcm", param=self._param, code="missing_stream_header")


def _digest(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=16).digest()
