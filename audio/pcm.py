"""PCM in: containers (WAV, mp3, m4a, flac, ogg, webm) via PyAV, raw f32/s16/G.711 bodies, resampled to 16 kHz
mono.

Everything returned is a 1-D float32 numpy array at `SAMPLE_RATE`, values finite.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import soxr

from audio.containers import container_kind
from audio.errors import AudioInputError
from audio.g711 import decode_g711
from audio.pcm_parameters import split_content_type, whole_number

if TYPE_CHECKING:
    from av import AudioFrame, AudioStream
    from av.container import InputContainer

__all__ = [
    "SAMPLE_RATE",
    "RAW_PCM_TYPES",
    "MIN_RATE",
    "MAX_RATE",
    "MIN_FILE_RATE",
    "MAX_FILE_RATE",
    "MIN_FILE_SECONDS",
    "check_file_length",
    "AudioInputError",
    "PcmFormat",
    "PcmStream",
    "parse_pcm_content_type",
    "is_raw_pcm",
    "reads_as_raw_pcm",
    "decode_raw_pcm",
    "decode_container",
    "audio_stream",
    "FrameResampler",
    "frame_mono",
    "ffmpeg_reason",
    "load_audio_file",
    "resample",
]

SAMPLE_RATE = 16000
# G.711's other names, as Asterisk, Twilio and other telephony tools label its bodies: read as RFC 3551's.
_G711_ALIASES = {"audio/x-mulaw": "audio/pcmu", "audio/mulaw": "audio/pcmu", "audio/x-alaw": "audio/pcma",
                 "audio/alaw": "audio/pcma"}
# Content types of raw sample bodies (rate, encoding and channels ride as parameters); audio/basic is RFC 2046's
# 8 kHz μ-law, audio/pcmu and audio/pcma RFC 3551's G.711.
RAW_PCM_TYPES = ("audio/pcm", "audio/l16", "audio/raw", "audio/pcmu", "audio/pcma", "audio/basic", *_G711_ALIASES)
MIN_RATE, MAX_RATE = 8000, 48000
# A container's own rate: what real files carry (4 kHz telephony to 384 kHz studio). A file claiming 1 Hz would
# be resampled 16,000-fold in memory (a 300 KB upload grew a worker past its RAM).
MIN_FILE_RATE, MAX_FILE_RATE = 4000, 384000
MIN_FILE_SECONDS = 0.1  # OpenAI's shortest file to transcribe: too short to hold a word

Encoding = Literal["f32le", "s16le", "s16be", "ulaw", "alaw"]
_ENCODING_ALIASES: dict[str, Encoding] = {
    "f32le": "f32le", "float32": "f32le", "f32": "f32le", "pcm_f32le": "f32le", "float": "f32le",
    "s16le": "s16le", "s16": "s16le", "int16": "s16le", "pcm_s16le": "s16le",
    "s16be": "s16be", "pcm_s16be": "s16be",
    "ulaw": "ulaw", "mulaw": "ulaw", "pcm_mulaw": "ulaw", "alaw": "alaw", "pcm_alaw": "alaw",
}
_DTYPES = {"f32le": "<f4", "s16le": "<i2", "s16be": ">i2"}
# what a type means without an `encoding` parameter (RFC 2586's L16 is big-endian; the G.711 types name theirs)
_DEFAULT_ENCODINGS: dict[str, Encoding] = {"audio/l16": "s16be", "audio/pcmu": "ulaw", "audio/basic": "ulaw",
                                           "audio/pcma": "alaw"}
_DEFAULT_ENCODINGS |= {alias: _DEFAULT_ENCODINGS[named] for alias, named in _G711_ALIASES.items()}
# Types whose name is their encoding (G.711's): an `encoding` naming another contradicts the type, and is refused.
_NAMED_ENCODING_TYPES = frozenset(t for t, e in _DEFAULT_ENCODINGS.items() if e in ("ulaw", "alaw"))
G711_RATE = 8000  # G.711's own rate: the default for its encodings
_RAW_TYPES_SHOWN = ("audio/pcm, audio/L16 or audio/raw (rate, encoding, channels as parameters), G.711 μ-law as "
                   "audio/pcmu, audio/basic, audio/x-mulaw or audio/mulaw, A-law as audio/pcma, audio/x-alaw or "
                   "audio/alaw (8000 Hz unless rate says otherwise)")


@dataclass(frozen=True)
class PcmFormat:
    """Raw PCM: sample rate, sample encoding (little-endian, or big-endian 16-bit: audio/L16's network order)
    and interleaved channel count."""

    rate: int = SAMPLE_RATE
    encoding: Encoding = "f32le"
    channels: int = 1

    @property
    def sample_bytes(self) -> int:
        return {"f32le": 4, "ulaw": 1, "alaw": 1}.get(self.encoding, 2)

    def seconds(self, n_bytes: int) -> float:
        """Seconds of audio `n_bytes` of this format hold. Raises nothing."""
        return n_bytes / (self.rate * self.sample_bytes * max(1, self.channels))


def is_raw_pcm(content_type: str | None) -> bool:
    """True for `audio/pcm…`, `audio/l16…`, `audio/raw…` and the G.711 types' (`audio/pcmu`, `audio/pcma`,
    `audio/basic`; `audio/x-mulaw`, `audio/mulaw`, `audio/x-alaw`, `audio/alaw`) bodies: raw samples the
    content-type's parameters describe. Anything else — `application/octet-stream` too — is a container that PyAV
    identifies from its own header (a raw guess would turn a file into noise). Raises nothing."""
    if not content_type:
        return False
    mime = content_type.split(";", 1)[0].strip().lower()
    return mime in RAW_PCM_TYPES


def reads_as_raw_pcm(content_type: str | None, body: bytes) -> bool:
    """A whole body is raw samples when its type says so and it opens with no container's signature: a WAV uploaded
    as `audio/L16` or `audio/pcm` is a WAV (OpenAI decides by the file; read raw it was empty text, or NaN).
    Raises nothing."""
    return is_raw_pcm(content_type) and container_kind(body) is None


_PCM_PARAMETERS = frozenset({"rate", "encoding", "channels"})


def parse_pcm_content_type(content_type: str | None) -> PcmFormat:
    """`audio/pcm;rate=48000;encoding=s16le` → PcmFormat (rate defaults to 16000, encoding to f32le;
    `audio/L16` means big-endian s16, as RFC 2586 and 3551 define it, `audio/pcmu`, `audio/basic` and
    `audio/(x-)mulaw` μ-law, `audio/pcma` and `audio/(x-)alaw` A-law, an `encoding` naming another refused; a G.711
    encoding's rate defaults to 8000). Raises AudioInputError for a bad rate, encoding or channel count, an encoding
    its type contradicts, or a parameter it does not know (never silently read as the default)."""
    mime, values = split_content_type(content_type or "audio/pcm")
    if unknown := sorted(set(values) - _PCM_PARAMETERS):
        raise AudioInputError(f"content-type parameter {_shown(unknown[0])} is not supported (rate, encoding, "
                              "channels)",
                              param=unknown[0][:60], code="invalid_content_type")
    encoding = _ENCODING_ALIASES.get(values.get("encoding", _DEFAULT_ENCODINGS.get(mime, "f32le")))
    if encoding is None:
        raise AudioInputError(f"PCM encoding {_shown(values.get('encoding', ''))} is not supported (use f32le, s16le, "
                              "s16be, ulaw or alaw)",
                              param="encoding", code="invalid_content_type")
    if mime in _NAMED_ENCODING_TYPES and encoding != (named := _DEFAULT_ENCODINGS[mime]):
        # audio/x-mulaw;encoding=alaw was read as A-law: which of the two the sender meant, only it knows
        raise AudioInputError(f"encoding={_shown(values['encoding'])} contradicts {mime}, which is "
                              f"{'μ-law' if named == 'ulaw' else 'A-law'} (encoding={named}): leave encoding out, or "
                              f"send audio/pcm;encoding={encoding}", param="encoding", code="invalid_content_type")
    rate = whole_number(values.get("rate", str(G711_RATE if encoding in ("ulaw", "alaw") else SAMPLE_RATE)))
    channels = whole_number(values.get("channels", "1"))
    if rate is None or channels is None:  # ASCII digits only: int() also read `٤٤١٠٠`, `+8000` and `8_000`
        bad = "rate" if rate is None else "channels"
        raise AudioInputError(f"{bad}={_shown(values[bad])} is not a number of at most 9 digits", param=bad,
                              code="invalid_content_type")
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioInputError(f"sample rate {rate} Hz is outside {MIN_RATE}–{MAX_RATE} Hz", param="rate",
                              code="unsupported_sample_rate")
    if not 1 <= channels <= 8:
        raise AudioInputError(f"{channels} channels is not supported (1–8)", param="channels",
                              code="invalid_content_type")
    return PcmFormat(rate, encoding, channels)


def _shown(value: str) -> str:
    # a header may be 100 kB: echoed whole, each bad request answered with as much
    return repr(value) if len(value) <= 60 else repr(value[:60]) + "…"


def _samples(body: bytes, fmt: PcmFormat, param: str = "body") -> np.ndarray:
    """Validate and interpret a raw body as mono float32 at fmt.rate. Raises AudioInputError naming `param`."""
    if not body:
        raise AudioInputError("empty audio body", param=param, code="empty_audio")
    frame = fmt.sample_bytes * fmt.channels
    if len(body) % frame:
        raise AudioInputError(
            f"{len(body)} bytes is not a whole number of {fmt.encoding} frames ({frame} bytes each)",
            param=param, code="invalid_pcm_length")
    if fmt.encoding in ("ulaw", "alaw"):
        x = decode_g711(body, fmt.encoding).astype(np.float32)
    else:
        x = np.frombuffer(body, dtype=_DTYPES[fmt.encoding]).astype(np.float32)
    if fmt.encoding == "f32le":
        if not np.isfinite(x).all():
            raise AudioInputError("PCM contains NaN or infinite samples", param=param, code="invalid_samples")
    else:
        x /= 32768.0
    if fmt.channels > 1:
        x = x.reshape(-1, fmt.channels).mean(axis=1, dtype=np.float32)
    return x


def resample(x: np.ndarray, rate_in: int, rate_out: int = SAMPLE_RATE) -> np.ndarray:
    """Band-limited resampling with soxr (HQ). Raises nothing for valid float input."""
    if rate_in == rate_out or x.size == 0:
        return np.ascontiguousarray(x, dtype=np.float32)
    return soxr.resample(np.ascontiguousarray(x, dtype=np.float32), rate_in, rate_out, quality="HQ").astype(
        np.float32, copy=False)


def decode_raw_pcm(body: bytes, fmt: PcmFormat, *, param: str = "body",
                   max_seconds: float | None = None) -> np.ndarray:
    """One complete raw body → 16 kHz mono float32. Raises AudioInputError naming `param` (empty, odd length,
    NaN/Inf, longer than `max_seconds`)."""
    x = _samples(body, fmt, param)
    if max_seconds is not None and x.size > max_seconds * fmt.rate:
        raise _too_long(max_seconds, param)
    return resample(x, fmt.rate)


class PcmStream:
    """Chunked raw PCM of one format (a live session): keeps soxr's filter state across chunks so
    250 ms pieces resample exactly like the whole; a bad chunk raises before any state changes."""

    def __init__(self, fmt: PcmFormat) -> None:
        self.format = fmt
        self._resampler = None if fmt.rate == SAMPLE_RATE else soxr.ResampleStream(
            fmt.rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")

    def push(self, body: bytes) -> np.ndarray:
        """Decode one chunk; returns the 16 kHz samples ready so far. Raises AudioInputError."""
        x = _samples(body, self.format)
        if self._resampler is None:
            return x
        return self._resampler.resample_chunk(x, last=False)

    def flush(self) -> np.ndarray:
        """The resampler's held-back tail (call once, at finish). Raises nothing."""
        if self._resampler is None:
            return np.zeros(0, np.float32)
        return self._resampler.resample_chunk(np.zeros(0, np.float32), last=True)


def decode_container(data: bytes | Path | str, *, param: str = "file",
                     max_seconds: float | None = None) -> np.ndarray:
    """Any container/codec PyAV (FFmpeg's libraries, bundled in the wheel) reads → 16 kHz mono float32.
    `max_seconds`: longer audio is refused as it decodes (a few MB of compressed silence can be hours).
    Raises AudioInputError for empty, unreadable, corrupt, audio-less, too long or oddly sampled input."""
    import av  # deferred: PyAV's import costs ~100 ms and raw-PCM-only callers never need it

    if isinstance(data, (bytes, bytearray, memoryview)):
        if not len(data):
            raise AudioInputError("the uploaded file is empty", param=param, code="empty_audio")
        source: object = io.BytesIO(bytes(data))
    else:
        source = str(data)
    try:
        with av.open(source, mode="r") as container:
            stream, rate = audio_stream(container, param)
            most = None if max_seconds is None else int(max_seconds * rate)
            out = FrameResampler(rate, param)
            # Planar float in the source's own layout, mixed down below; the rate change is soxr's job (proper
            # band-limited resampling). FFmpeg's own down-mix keeps power, not level: stereo came out x1.41.
            planar = av.AudioResampler(format="fltp", rate=rate)
            for frame in container.decode(stream):
                for piece in planar.resample(frame):
                    out.add(frame_mono(piece))
                if most is not None and out.decoded > most:
                    raise _too_long(max_seconds or 0.0, param)
            for piece in planar.resample(None):
                if piece is not None:  # a pass-through resampler (the file was fltp already) "flushes" None
                    out.add(frame_mono(piece))
    except (AudioInputError, MemoryError):
        raise
    except Exception as exc:  # whatever PyAV raises on a file is the file's fault (a bad header: AttributeError)
        # A body of raw samples under a type we do not take for raw lands here: say which types are.
        raw_types = f"; raw samples are read as such under {_RAW_TYPES_SHOWN}" if isinstance(source, io.BytesIO) else ""
        raise AudioInputError(f"could not decode the audio file{ffmpeg_reason(exc)}: it is corrupt or not an audio "
                              f"format this server reads{raw_types}", param=param,
                              code="unsupported_or_corrupt_audio") from None
    if not out.decoded:
        raise AudioInputError("the file contains no audio samples", param=param, code="empty_audio")
    return out.finish()


def audio_stream(container: InputContainer, param: str) -> tuple[AudioStream, int]:
    """An opened container's first audio stream and its sample rate. Raises AudioInputError (no audio stream, a rate
    outside MIN_FILE_RATE–MAX_FILE_RATE)."""
    if not container.streams.audio:
        raise AudioInputError("the file has no audio stream", param=param, code="no_audio_stream")
    stream = container.streams.audio[0]
    rate = stream.rate or SAMPLE_RATE
    if not MIN_FILE_RATE <= rate <= MAX_FILE_RATE:
        raise AudioInputError(f"the file's sample rate {rate} Hz is outside {MIN_FILE_RATE}–{MAX_FILE_RATE} Hz",
                              param=param, code="unsupported_sample_rate")
    return stream, rate


class FrameResampler:
    """A file's 16 kHz samples, resampled frame by frame as PyAV decodes them: only 16 kHz audio is held, so a
    small upload of 384 kHz silence no longer holds (and copies) hours at its own rate (~24 GB for 2 h).
    ResampleStream gives soxr.resample's samples exactly (the same HQ filter, its state kept across frames)."""

    def __init__(self, rate: int, param: str) -> None:
        self._param = param
        self._stream = None if rate == SAMPLE_RATE else soxr.ResampleStream(
            rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")
        self._blocks: list[np.ndarray] = []
        self._pending: list[np.ndarray] = []  # a few frames' samples, merged into one block every ~4 s
        self._pending_size = 0
        self.decoded = 0  # samples at the file's own rate

    def add(self, mono: np.ndarray) -> None:
        """One decoded frame, mixed down. Raises AudioInputError for NaN or infinite samples."""
        if not np.isfinite(mono).all():
            raise AudioInputError("decoded audio contains NaN or infinite samples", param=self._param,
                                  code="invalid_samples")
        self.decoded += mono.size
        self._keep(mono if self._stream is None else self._stream.resample_chunk(mono, last=False))

    def _keep(self, x: np.ndarray) -> None:
        # a 384 kHz frame leaves ~200 samples at 16 kHz: an array each would add ~15 % in object headers
        self._pending.append(x)
        self._pending_size += x.size
        if self._pending_size >= _BLOCK:
            self._blocks.append(np.concatenate(self._pending).astype(np.float32, copy=False))
            self._pending, self._pending_size = [], 0

    def take(self) -> np.ndarray:
        """What was resampled since the last take (a stream decoded as it arrives). Raises nothing."""
        blocks = [*self._blocks, *self._pending]
        self._blocks, self._pending, self._pending_size = [], [], 0
        return np.concatenate(blocks).astype(np.float32, copy=False) if blocks else np.zeros(0, np.float32)

    def finish(self) -> np.ndarray:
        """All of it (since the last take), the resampler's held-back tail included (call once). Raises nothing."""
        if self._stream is not None:
            self._pending.append(self._stream.resample_chunk(np.zeros(0, np.float32), last=True))
        return self.take()


_BLOCK = 4 * SAMPLE_RATE


def ffmpeg_reason(exc: Exception) -> str:
    """FFmpeg's own words for a decode failure, without the errno and '<none>' file name str() adds
    ("[Errno 1094995529] Invalid data found when processing input: '<none>'")."""
    strerror = getattr(exc, "strerror", None)
    if isinstance(strerror, str) and strerror.strip():
        return f" ({strerror.strip().rstrip('.').lower()})"
    return ""  # a Python error inside PyAV (a header it cannot describe) says nothing a client can act on


def frame_mono(frame: AudioFrame) -> np.ndarray:
    """One planar float frame (channels × samples) → its channels' mean, as raw PCM bodies are mixed down."""
    planes = np.asarray(frame.to_ndarray(), dtype=np.float32)
    return planes.reshape(-1) if planes.shape[0] == 1 else planes.mean(axis=0, dtype=np.float32)


def check_file_length(pcm: np.ndarray, param: str = "file") -> None:
    """Raises AudioInputError audio_too_short for decoded audio under MIN_FILE_SECONDS, as OpenAI refuses it
    (the server and `tandem transcribe` alike)."""
    seconds = len(pcm) / SAMPLE_RATE
    if seconds < MIN_FILE_SECONDS:
        raise AudioInputError(f"The audio is {seconds:.3f} s long; at least {MIN_FILE_SECONDS} s is needed.",
                              param=param, code="audio_too_short")


def _too_long(max_seconds: float, param: str) -> AudioInputError:
    return AudioInputError(f"the audio is longer than {max_seconds:g} s, the most this server transcribes in one "
                           "request (split it, or stream it through a live session)", param=param,
                           code="audio_too_long")


def load_audio_file(path: str | Path) -> np.ndarray:
    """A file on disk, or a pipe (`/dev/stdin`, a shell's `<(…)`), → 16 kHz mono float32. Raises
    FileNotFoundError (IsADirectoryError for a directory), other OSErrors from reading it (PermissionError),
    AudioInputError (empty_audio for a zero-byte file)."""
    p = Path(path)
    if p.is_dir():
        raise IsADirectoryError(f"{p} is a directory, not an audio file")
    if not p.exists():
        raise FileNotFoundError(f"no such audio file: {p}")
    if not p.is_file():  # a pipe is read whole first: FFmpeg cannot seek in it (an m4a's index may come last)
        with p.open("rb") as f:
            data = f.read()
        if not data:
            raise AudioInputError("the file is empty", param="file", code="empty_audio")
        return decode_container(data, param="file")
    if p.stat().st_size == 0:  # as an empty upload is told: FFmpeg would call it invalid data
        raise AudioInputError("the file is empty", param="file", code="empty_audio")
    return decode_container(p, param="file")
