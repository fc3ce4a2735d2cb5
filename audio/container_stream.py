"""One container stream decoded as it arrives: a browser's MediaRecorder started with a timeslice
(`recorder.start(250)`) gives blobs of ONE WebM (Chrome), Ogg (Firefox) or fragmented-MP4 (Safari) stream, and only
the first carries the header; each later blob is a continuation no decoder reads on its own.

A decoder thread reads the stream through PyAV from a blocking pipe (no seeking: FFmpeg reads it front to back, as
from a socket). `feed` hands it a chunk and returns once the decoder has consumed it — it waits for more bytes, reached
the stream's end, or failed — with the 16 kHz mono samples decoded so far (audio/pcm.py's resampling and mix-down, as a
whole file's). `close` ends the input and returns the tail the decoder held back (a partial packet, the codec's and the
resampler's delay); `abort` ends the thread without it.
"""

from __future__ import annotations

import threading

import numpy as np

from audio.errors import AudioInputError
from audio.pcm import FrameResampler, audio_stream, ffmpeg_reason, frame_mono

__all__ = ["ContainerStream", "STREAM_FORMATS", "STREAM_NAMES", "CLOSE_TIMEOUT"]

# container_kind's kinds decoded as they arrive, as FFmpeg's demuxers name them (named, FFmpeg skips its probe,
# which would wait for 2 KB before the first byte is parsed). No WAV: FFmpeg's reads 64 KB past its header (looking
# for S/PDIF), so a short WAV gave nothing until the next chunk came.
STREAM_FORMATS = {"matroska": "matroska", "ogg": "ogg", "mp4": "mov"}
STREAM_NAMES = {"matroska": "WebM", "ogg": "Ogg", "mp4": "MP4"}
# Read no further than the first packet to learn the stream's parameters: the first 250 ms blob yields audio.
_PROBE = {"probesize": "32", "analyzeduration": "100000"}
CLOSE_TIMEOUT = 5.0  # seconds a closing stream's decoder has to flush its tail (it decodes one chunk's rest at most)
# What a stream may take for the audio it gives, checked as each chunk is consumed (a whole file fed as one chunk
# passes): FFmpeg kept every byte of a header that never ended (7 MB chunks of Matroska attachments, no audio) and
# swallowed a stream whose demuxer lost its place (a chunk sent twice) with no audio and no error.
_FIRST_AUDIO_BYTES = 1 << 20  # before its first audio: MediaRecorder's headers are under 1 KB, FFmpeg's a few KB
_BYTES_PER_SECOND = 2 << 20  # then per second of audio decoded (16 Mbit/s: any audio codec, 8-channel PCM, video too)
_STALL_SECONDS = 10.0  # read with no audio out: 10 s of the stream at the rate it gave audio (at least _STALL_BYTES)
_STALL_BYTES = 64 << 10  # (an audio frame is a few KB at most; a video frame between two audio ones, ~rate/fps)


class _Aborted(Exception):
    """The stream was aborted: the decoder thread stops where it is."""


class _Pipe:
    """The file object PyAV reads a stream from: readable, not seekable."""

    def __init__(self, stream: "ContainerStream") -> None:
        self.read = stream._read

    def readable(self) -> bool:
        return True


class ContainerStream:
    """One stream of container `kind` (a key of STREAM_FORMATS); thread-safe. See the module doc."""

    def __init__(self, kind: str, *, param: str = "body") -> None:
        self.kind, self._param = kind, param
        self._cv = threading.Condition()
        self._unread = bytearray()  # fed, not yet read by the decoder
        self._eof = False  # no more bytes come: the decoder reads to the end and flushes
        self._aborted = False
        self._waiting = False  # the decoder is blocked for more bytes: it has consumed all it was fed
        self._ended = False  # the decoder thread is done (the stream's end, a failure, or an abort)
        self.error: AudioInputError | None = None
        self._out: FrameResampler | None = None
        self._tail = np.zeros(0, np.float32)  # the resampler's last samples, once the stream ended
        self._max_seconds: float | None = None  # this feed's limit
        self._fed_samples = 0  # decoded during this feed, at the stream's own rate
        self._rate = 0  # the stream's sample rate, once its header was read
        self._decoded = 0  # samples decoded, at that rate
        self._bytes_in = 0  # bytes the decoder read
        self._gap = 0  # ... since the last decoded frame
        self._thread = threading.Thread(target=self._run, name=f"decode-{kind}", daemon=True)
        self._thread.start()

    @property
    def ended(self) -> bool:
        """The decoder is done: the stream reached its own end, failed or was closed. Raises nothing."""
        with self._cv:
            return self._ended

    def feed(self, data: bytes, max_seconds: float | None = None) -> np.ndarray:
        """Decode `data`, the stream's next bytes; blocks until the decoder has consumed them. Returns the 16 kHz
        samples decoded meanwhile. `max_seconds`: more decoded audio than this from `data` is refused. Raises
        AudioInputError (the decoder failed, or the stream took more bytes than its audio accounts for: the stream
        has ended, the samples of `data` are dropped; or it had ended before)."""
        with self._cv:
            if self._ended or self._eof:
                raise AudioInputError(f"the {STREAM_NAMES[self.kind]} stream has ended", param=self._param,
                                      code="stream_ended")
            self._unread += data
            self._fed_samples, self._max_seconds = 0, max_seconds
            self._cv.notify_all()
            while not (self._ended or (self._waiting and not self._unread)):
                self._cv.wait()
            if self.error is None and not self._ended and (overrun := self._overrun()) is not None:
                self.error, self._aborted, self._eof = overrun, True, True  # the decoder stops where it is
                self._cv.notify_all()
            if self.error is not None:
                self._take()  # this chunk's samples go with it: a refused chunk is taken in nothing
                raise self.error
            return self._take()

    def close(self, timeout: float = CLOSE_TIMEOUT) -> np.ndarray:
        """End the input: returns the samples the decoder still held (a failure at the very end, a stream cut
        mid-packet, keeps those it gave). Decoding past `timeout` seconds aborts it. Raises nothing."""
        with self._cv:
            self._eof = True
            self._cv.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.abort()
            return np.zeros(0, np.float32)
        with self._cv:
            return self._take()

    def abort(self) -> None:
        """Stop the decoder without its tail; returns at once, the thread ends by itself. Raises nothing."""
        with self._cv:
            self._aborted = self._eof = True
            self._cv.notify_all()

    def _overrun(self) -> AudioInputError | None:
        """Why the bytes read so far are more than the audio decoded from them accounts for (None: they are not).
        Under the lock, between feeds. Raises nothing."""
        name = STREAM_NAMES[self.kind]
        if not self._decoded:
            if self._bytes_in <= _FIRST_AUDIO_BYTES:
                return None
            why = f"gave no audio in its first {self._bytes_in} bytes (a header takes a few KB)"
        else:
            seconds = self._decoded / self._rate
            if self._bytes_in > _FIRST_AUDIO_BYTES + _BYTES_PER_SECOND * seconds:
                why = (f"took {self._bytes_in} bytes for {seconds:.1f} s of audio (more than {_BYTES_PER_SECOND >> 20} "
                       "MiB a second)")
            elif self._gap > max(_STALL_BYTES, _STALL_SECONDS * (self._bytes_in - self._gap) / seconds):
                why = (f"gave no audio in its last {self._gap} bytes, after {seconds:.1f} s of audio: its decoder lost "
                       "its place (a chunk sent twice, out of order or left out?)")
            else:
                return None
        return AudioInputError(f"the {name} stream {why}; it ended here: start a new one with a chunk that carries its "
                               "header", param=self._param, code="unsupported_or_corrupt_audio")

    def _take(self) -> np.ndarray:
        # under the lock
        parts = [] if self._out is None else [self._out.take()]
        parts.append(self._tail)
        self._tail = np.zeros(0, np.float32)
        return np.concatenate(parts).astype(np.float32, copy=False)

    # ---- the decoder thread ---------------------------------------------------------------------
    def _read(self, size: int) -> bytes:
        """PyAV's input: up to `size` fed bytes, waiting for some; b"" at the end (an abort's too: an exception
        raised here, inside FFmpeg, is printed when PyAV drops it). Raises nothing."""
        with self._cv:
            while not self._unread and not self._eof:
                self._waiting = True
                self._cv.notify_all()
                self._cv.wait()
            self._waiting = False
            if self._aborted:
                return b""
            out = bytes(self._unread[:size])
            del self._unread[:size]
            self._bytes_in += len(out)
            self._gap += len(out)
            return out

    def _run(self) -> None:
        import av  # deferred, as audio/pcm.py's

        try:
            with av.open(_Pipe(self), mode="r", format=STREAM_FORMATS[self.kind], options=_PROBE) as container:
                stream, rate = audio_stream(container, self._param)
                with self._cv:
                    self._out, self._rate = FrameResampler(rate, self._param), rate
                planar = av.AudioResampler(format="fltp", rate=rate)
                for frame in container.decode(stream):
                    for piece in planar.resample(frame):
                        self._add(frame_mono(piece), rate)
                for piece in planar.resample(None):
                    if piece is not None:
                        self._add(frame_mono(piece), rate)
                with self._cv:
                    self._tail = self._out.finish()
        except _Aborted:
            pass
        except AudioInputError as exc:
            self._fail(exc)
        except Exception as exc:  # whatever FFmpeg makes of bad bytes (or of an abort's early end)
            if not self._aborted:
                self._fail(AudioInputError(
                    f"could not decode the {STREAM_NAMES[self.kind]} stream at this chunk{ffmpeg_reason(exc)}: it is "
                    "corrupt, or not the continuation of the stream the session's last chunk with a header began",
                    param=self._param, code="unsupported_or_corrupt_audio"))
        finally:
            with self._cv:
                self._ended = True
                self._cv.notify_all()

    def _add(self, mono: np.ndarray, rate: int) -> None:
        """One decoded frame, mixed down. Raises AudioInputError (NaN samples, over the feed's limit), _Aborted."""
        with self._cv:
            if self._aborted:
                raise _Aborted()
            assert self._out is not None
            self._fed_samples += mono.size
            if self._max_seconds is not None and self._fed_samples > self._max_seconds * rate:
                raise AudioInputError(f"the chunk decodes to more than {self._max_seconds:g} s of audio, the most it "
                                      "may bring (send shorter chunks)", param=self._param, code="audio_too_long")
            self._out.add(mono)
            if mono.size:
                self._decoded += mono.size
                self._gap = 0

    def _fail(self, exc: AudioInputError) -> None:
        with self._cv:
            self.error = self.error or exc  # an overrun feed() found stopped it first: that is why
            if self._eof and self._out is not None:  # failed at the end (a stream cut mid-packet): what it gave stays
                self._tail = self._out.finish()

    def __repr__(self) -> str:
        return f"ContainerStream({self.kind!r}, ended={self._ended})"
