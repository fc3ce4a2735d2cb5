"""audio/pcm_headers.py: the header of a WAV or Sun .au written to a pipe says how to read the samples after it,
piece by piece, whatever the cuts; samples it cannot read in pieces, and headers that are none, are refused."""

from __future__ import annotations

import io
import struct
import wave

import numpy as np
import pytest

from audio.errors import AudioInputError
from audio.pcm import PcmFormat
from audio.pcm_headers import MAX_HEADER_BYTES, HeadedPcm, PcmHeader, pcm_header
from tests.fixtures.piped_audio import piped, wave_tone


def wav_header(tag: int = 1, channels: int = 1, rate: int = 16000, bits: int = 16, size: int = 0xFFFFFFFF,
               riff: bytes = b"RIFF", extra: bytes = b"") -> bytes:
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * block, block, bits)
    return riff + struct.pack("<I", 0xFFFFFFFF) + b"WAVE" + extra + b"fmt " + struct.pack("<I", 16) + fmt + \
        b"data" + struct.pack("<I", size)


@pytest.mark.parametrize("codec, channels, read_as", [("pcm_s16le", 2, PcmFormat(48000, "s16le", 2)),
                                                      ("pcm_f32le", 1, PcmFormat(48000, "f32le", 1)),
                                                      ("pcm_mulaw", 1, PcmFormat(48000, "ulaw", 1)),
                                                      ("pcm_alaw", 2, PcmFormat(48000, "alaw", 2))])
def test_ffmpegs_piped_wav_header_gives_the_samples_format_and_no_length(codec: str, channels: int,
                                                                         read_as: PcmFormat) -> None:
    data = piped("wav", codec, wave_tone(0.5, 48000), 48000, channels)  # fmt, then a LIST chunk, then data
    header = pcm_header(data)
    assert header is not None and header.format == read_as and header.length is None
    assert not header.whole_in(data)
    assert (len(data) - header.offset) % (read_as.sample_bytes * channels) == 0
    assert len(data) - header.offset == int(0.5 * 48000) * read_as.sample_bytes * channels


def test_a_whole_wav_file_declares_its_samples_and_is_whole() -> None:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(22050)
        w.writeframes(np.zeros(2205, "<i2").tobytes())
    data = buf.getvalue()
    header = pcm_header(data)
    assert header == PcmHeader("wav", 44, 4410, PcmFormat(22050, "s16le"), "", trailing=0)  # nothing after the samples
    assert header.whole_in(data) and not header.whole_in(data[:-1])


def test_a_header_cut_anywhere_waits_for_the_rest() -> None:
    data = piped("wav", "pcm_s16le", wave_tone(0.1, 16000), 16000)
    full = pcm_header(data)
    assert full is not None
    assert all(pcm_header(data[:cut]) is None for cut in range(12, full.offset))
    assert pcm_header(data[:full.offset]) == full


@pytest.mark.parametrize("data, read_as, length", [
    (wav_header(riff=b"RF64", size=0xFFFFFFFF, extra=b"ds64" + struct.pack("<IQQQI", 28, 0, 6400, 3200, 0)),
     PcmFormat(16000, "s16le"), 6400),  # RF64: the size is ds64's
    (wav_header(size=0), PcmFormat(16000, "s16le"), None),  # a writer that leaves 0 to fill in later
    (b".snd" + struct.pack(">IIIII", 32, 0xFFFFFFFF, 3, 16000, 1) + b"\0" * 8, PcmFormat(16000, "s16be"), None),
    (b".snd" + struct.pack(">IIIII", 24, 800, 1, 8000, 1), PcmFormat(8000, "ulaw"), 800),
    (b".snd" + struct.pack(">IIIII", 24, 0xFFFFFFFF, 27, 8000, 2), PcmFormat(8000, "alaw", 2), None),
])
def test_rf64_and_sun_au_headers_are_read(data: bytes, read_as: PcmFormat, length: int | None) -> None:
    header = pcm_header(data)
    assert header is not None and header.format == read_as and header.length == length
    assert header.offset == len(data)


def test_ffmpegs_piped_au_is_read() -> None:
    data = piped("au", "pcm_s16be", wave_tone(0.25, 16000), 16000)
    header = pcm_header(data)
    assert header is not None and header.format == PcmFormat(16000, "s16be") and header.length is None
    assert len(data) - header.offset == 4000 * 2


@pytest.mark.parametrize("data, samples", [
    (wav_header(bits=24), "24-bit PCM"), (wav_header(bits=8), "8-bit PCM"), (wav_header(tag=3, bits=64),
                                                                              "64-bit float"),
    (wav_header(tag=0x11, bits=4), "4-bit (format tag 0x0011)"),
    (b".snd" + struct.pack(">IIIII", 24, 0xFFFFFFFF, 6, 16000, 1), "32-bit float"),
])
def test_samples_pcmformat_cannot_read_are_named_when_asked_for(data: bytes, samples: str) -> None:
    header = pcm_header(data, "audio")
    assert header is not None and header.format is None and header.samples == samples
    with pytest.raises(AudioInputError) as refused:
        HeadedPcm(header, "audio")
    assert refused.value.code == "unsupported_sample_format" and refused.value.param == "audio"
    assert samples in refused.value.message


def test_ffmpegs_extensible_24_bit_wav_is_named_too() -> None:
    header = pcm_header(piped("wav", "pcm_s24le", wave_tone(0.1, 16000), 16000, 2))
    assert header is not None and header.format is None and header.samples == "24-bit PCM"


@pytest.mark.parametrize("data, code", [
    (b"RIFF\xff\xff\xff\xffWAVEdata\xff\xff\xff\xff", "unsupported_or_corrupt_audio"),  # samples before fmt
    (wav_header(rate=1), "unsupported_sample_rate"),
    (wav_header(channels=0), "unsupported_or_corrupt_audio"),
    (wav_header(channels=12), "unsupported_or_corrupt_audio"),
    (b"RIFF\xff\xff\xff\xffWAVELIST\xff\xff\xff\x00" + bytes(MAX_HEADER_BYTES), "unsupported_or_corrupt_audio"),
    (b".snd" + struct.pack(">IIIII", 8, 0xFFFFFFFF, 3, 16000, 1), "unsupported_or_corrupt_audio"),
    (b".snd" + struct.pack(">IIIII", 1 << 20, 0xFFFFFFFF, 3, 16000, 1), "unsupported_or_corrupt_audio"),
])
def test_a_header_that_is_none_is_refused_naming_the_audio(data: bytes, code: str) -> None:
    with pytest.raises(AudioInputError) as refused:
        pcm_header(data, "audio")
    assert refused.value.code == code and refused.value.param == "audio"


def fed(headed: HeadedPcm, pieces: list[bytes]) -> bytes:
    out: list[bytes] = []
    for piece in pieces:
        headed.feed(piece, out.append)
    return b"".join(out)


def test_samples_cut_inside_a_sample_are_put_back_together() -> None:
    data = piped("wav", "pcm_f32le", wave_tone(0.5, 16000), 16000, 2)  # 8-byte frames after a 80-byte header
    header = pcm_header(data)
    assert header is not None
    headed = HeadedPcm(header)
    samples = data[header.offset:]
    out: list[bytes] = []
    for at in range(0, len(samples), 1001):  # a pipe's reads: any size
        headed.feed(samples[at:at + 1001], out.append)
        assert all(len(x) % 8 == 0 for x in out)
    assert b"".join(out) == samples


def test_nothing_past_the_declared_samples_is_taken() -> None:
    header = pcm_header(wav_header(size=3000))
    assert header is not None
    headed = HeadedPcm(header)
    samples = bytes(range(256)) * 12  # 3072 bytes: the 72 after the declared 3000 are a trailing chunk
    assert fed(headed, [samples[:1000], samples[1000:2999], samples[2999:]]) == samples[:3000]
    assert headed.ended and fed(headed, [b"LIST\x04\x00\x00\x00INFO"]) == b""


def test_a_piece_refused_leaves_it_as_it_was() -> None:
    header = pcm_header(wav_header(size=4000))
    assert header is not None
    headed = HeadedPcm(header)
    assert fed(headed, [b"\x01\x02\x03"]) == b"\x01\x02"  # one byte held

    def refuse(_: bytes) -> None:
        raise AudioInputError("full", param="audio", code="session_backlog_full")

    with pytest.raises(AudioInputError):
        headed.feed(b"\x04\x05\x06\x07", refuse)
    assert headed.left == 4000 - 3 and fed(headed, [b"\x04\x05\x06\x07"]) == b"\x03\x04\x05\x06"  # sent again
