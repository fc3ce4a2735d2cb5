"""Raw PCM that opens with a file's header: a WAV (RIFF, RF64, BW64) or Sun .au written to a pipe and sent on as it
is recorded (`arecord -t wav -`, `ffmpeg … -f wav -`, `sox … -t au -`), its header in the first piece, the samples in
the pieces after it, often with a size it could not know (0xFFFFFFFF, 0, or arecord's 2 GiB).

The header says what the samples are (rate, channels, sample format), so they are read as such; a piece's cut may
fall inside a sample (the header's length is any number of bytes), so a partial sample waits for the next piece;
past the samples the header declares comes the file's trailing chunks (WAV's LIST), which are no audio. Samples
PcmFormat does not read (8-, 24- or 32-bit integers, 64-bit float, ADPCM...) are refused naming what they are: a
whole file of them is FFmpeg's to decode (audio/pcm.py decode_container), a stream of them cannot be read in pieces.
AIFF and CAF are left to FFmpeg whole: no recorder streams them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from audio.containers import container_kind
from audio.errors import AudioInputError
from audio.pcm import MAX_FILE_RATE, MIN_FILE_RATE, Encoding, PcmFormat

__all__ = ["HEADED_KINDS", "MAX_HEADER_BYTES", "PcmHeader", "HeadedPcm", "pcm_header"]

HEADED_KINDS = ("wav", "au")  # audio/containers.py's kinds whose samples follow a header as raw PCM
# A header's most bytes (its chunks before the samples: fmt, LIST, JUNK, bext...); real ones take well under 4 KiB.
MAX_HEADER_BYTES = 64 * 1024
_UNKNOWN = 0xFFFFFFFF  # a WAV's or .au's size its writer could not know (a pipe cannot be seeked back to fill it)
_MAX_CHANNELS = 8  # as raw PCM's content type takes
# WAV format tags (and WAVE_FORMAT_EXTENSIBLE's sub-format, whose GUID opens with the tag) PcmFormat reads
_WAV_TAGS: dict[tuple[int, int], Encoding] = {(1, 16): "s16le", (3, 32): "f32le", (6, 8): "alaw", (7, 8): "ulaw"}
_WAV_EXTENSIBLE = 0xFFFE
_WAV_NAMES = {1: "PCM", 3: "float"}
_AU_ENCODINGS: dict[int, Encoding] = {1: "ulaw", 3: "s16be", 27: "alaw"}
_AU_NAMES = {2: "8-bit PCM", 4: "24-bit PCM", 5: "32-bit PCM", 6: "32-bit float", 7: "64-bit float"}


@dataclass(frozen=True)
class PcmHeader:
    """A header read whole: where its samples begin, how many bytes of them it declares (None: unknown), their
    format (None: samples PcmFormat does not read, `samples` says which), and how many bytes of the file follow them
    (a WAV's trailing chunks; None: unknown, all that come)."""

    kind: str
    offset: int
    length: int | None
    format: PcmFormat | None
    samples: str
    trailing: int | None = None

    def whole_in(self, body: bytes) -> bool:
        """`body` holds all the samples the header declares: a whole file, not the start of a stream. Raises
        nothing."""
        return self.length is not None and self.offset + self.length <= len(body)

    def pcm_format(self, param: str) -> PcmFormat:
        """The samples' format. Raises AudioInputError naming `param` when PcmFormat cannot read them."""
        if self.format is None:
            name = "a WAV" if self.kind == "wav" else "a Sun .au"
            raise AudioInputError(
                f"{name} of {self.samples} samples cannot be read in pieces: send 16-bit PCM, 32-bit float, μ-law or "
                "A-law (`arecord -f S16_LE`, `ffmpeg … -c:a pcm_s16le`), or the whole file in one piece",
                param=param, code="unsupported_sample_format")
        return self.format


def pcm_header(body: bytes, param: str = "body") -> PcmHeader | None:
    """The WAV or .au header `body` opens with (container_kind: "wav" or "au"), or None while it goes on past `body`
    (the rest comes in the next piece). Raises AudioInputError naming `param`: a header that is not one (no fmt
    before the samples, a chunk of unknown size), over MAX_HEADER_BYTES, or a rate or channel count out of range."""
    kind = container_kind(body)
    header = _wav(body, param) if kind == "wav" else _au(body, param) if kind == "au" else None
    if header is None and len(body) > MAX_HEADER_BYTES:
        raise _bad(f"its header goes on past {MAX_HEADER_BYTES} bytes", kind, param)
    if header is not None and header.format is not None:
        fmt = header.format
        if not MIN_FILE_RATE <= fmt.rate <= MAX_FILE_RATE:
            raise AudioInputError(f"the header's sample rate {fmt.rate} Hz is outside {MIN_FILE_RATE}–{MAX_FILE_RATE}"
                                  " Hz", param=param, code="unsupported_sample_rate")
        if not 1 <= fmt.channels <= _MAX_CHANNELS:
            raise _bad(f"its header gives {fmt.channels} channels (1–{_MAX_CHANNELS} are read)", kind, param)
    return header


def _wav(body: bytes, param: str) -> PcmHeader | None:
    at, fmt, samples, length64, riff64 = 12, None, "", None, None
    while at + 8 <= len(body):
        chunk, size = body[at:at + 4], int.from_bytes(body[at + 4:at + 8], "little")
        if chunk == b"data":
            if fmt is None:
                raise _bad("its samples come before its fmt chunk", "wav", param)
            length = length64 if size == _UNKNOWN and length64 else None if size in (0, _UNKNOWN) else size
            size = int.from_bytes(body[4:8], "little")  # the RIFF's: the file's length after its first 8 bytes
            riff = riff64 if size == _UNKNOWN and riff64 else None if size in (0, _UNKNOWN) else size
            trailing = None if length is None or riff is None else max(0, 8 + riff - (at + 8 + length))
            return PcmHeader("wav", at + 8, length, fmt if samples == "" else None, samples, trailing)
        if at + 8 + size > len(body):
            return None  # this chunk goes on in the next piece
        data = body[at + 8:at + 8 + size]
        if chunk == b"fmt ":
            if size < 16:
                raise _bad("its fmt chunk is cut short", "wav", param)
            tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", data[:16])
            if tag == _WAV_EXTENSIBLE and size >= 26:
                tag = int.from_bytes(data[24:26], "little")
            encoding = _WAV_TAGS.get((tag, bits))
            fmt = PcmFormat(rate, encoding or "s16le", channels)
            samples = "" if encoding else f"{bits}-bit {_WAV_NAMES.get(tag, f'(format tag {tag:#06x})')}"
        elif chunk == b"ds64" and size >= 16:  # RF64 / BW64: the data's 64-bit size, its 32-bit one 0xFFFFFFFF
            riff64, length64 = int.from_bytes(data[0:8], "little"), int.from_bytes(data[8:16], "little")
        at += 8 + size + (size & 1)  # chunks are padded to even lengths
    return None


def _au(body: bytes, param: str) -> PcmHeader | None:
    if len(body) < 24:
        return None
    offset, size, encoding, rate, channels = struct.unpack(">IIIII", body[4:24])
    if offset < 24:
        raise _bad("its header's length is under 24 bytes", "au", param)
    if offset > len(body):
        if offset > MAX_HEADER_BYTES:
            raise _bad(f"its header goes on past {MAX_HEADER_BYTES} bytes", "au", param)
        return None
    name = _AU_ENCODINGS.get(encoding)
    samples = "" if name else _AU_NAMES.get(encoding, f"encoding {encoding}")
    fmt = PcmFormat(rate, name or "s16be", channels)
    length = None if size == _UNKNOWN else size
    return PcmHeader("au", offset, length, fmt if name else None, samples, None if length is None else 0)


def _bad(why: str, kind: str | None, param: str) -> AudioInputError:
    name = "WAV" if kind == "wav" else "Sun .au"
    return AudioInputError(f"the {name} header cannot be read: {why}", param=param, code="unsupported_or_corrupt_audio")


class HeadedPcm:
    """The samples after one header, piece by piece: whole samples out, a partial one held for the next piece, and
    nothing past the length the header declares (the file's trailing chunks); what comes after the file is not its."""

    def __init__(self, header: PcmHeader, param: str = "body") -> None:
        self.format = header.pcm_format(param)
        self.left = header.length  # bytes of samples still to come (None: all that come)
        self.trailing = header.trailing  # bytes of the file after its samples still to come (None: not known)
        self._pad = (header.length or 0) & 1  # the byte that pads odd samples before a trailing chunk
        self._held = b""

    @property
    def ended(self) -> bool:
        """All the samples the header declares came: what follows is no audio. Raises nothing."""
        return self.left is not None and self.left <= 0

    @property
    def over(self) -> bool:
        """The whole file came, its trailing chunks too: what follows is another input's. Raises nothing."""
        return self.ended and self.trailing == 0

    def feed(self, piece: bytes, take: Callable[[bytes], object]) -> bytes:
        """Hand `piece`'s whole samples (after the partial one the piece before left) to `take`, when there are any;
        returns what of `piece` comes after the whole file (b"" while it goes on). Raises what `take` raises, and
        then is as before the piece (the piece may be sent again)."""
        left, held, trailing, past, after = self.left, self._held, self.trailing, b"", b""
        if left is not None:
            piece, after = piece[:max(0, left)], piece[max(0, left):]
            left -= len(piece)
            if after and trailing is None and not _chunk_id(after[self._pad:self._pad + 4]):
                trailing = 0  # a file of unknown size ends at the first piece after its samples that is no chunk
            if after and trailing is not None:
                past, trailing = after[trailing:], max(0, trailing - len(after))
        data = held + piece
        frame = self.format.sample_bytes * self.format.channels
        cut = len(data) - len(data) % frame
        if cut:
            take(data[:cut])
        self.left, self._held, self.trailing = left, data[cut:], trailing
        if after:
            self._pad = 0
        return past


def _chunk_id(four: bytes) -> bool:
    """Whether `four` is a RIFF chunk's id (LIST, id3 , bext...): four printable ASCII characters. Raises nothing."""
    return len(four) == 4 and all(0x20 <= b < 0x7F for b in four)
