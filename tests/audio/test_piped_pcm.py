"""audio/piped_pcm.py: a WAV / .au written to a pipe and sent in pieces cut anywhere (FFmpeg's muxer through PyAV),
what follows it, and a refused chunk sent again."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest

from audio.errors import AudioInputError
from audio.pcm import PcmFormat
from audio.pcm_headers import pcm_header
from audio.piped_pcm import PipedPcm
from tests.fixtures.piped_audio import piped, wave_tone


def run(pieces: list[bytes]) -> tuple[list[tuple[bytes, PcmFormat]], list[bytes | None]]:
    """Each piece taken in turn: what went to the append, and what each take returned."""
    got: list[tuple[bytes, PcmFormat]] = []
    p = PipedPcm("audio")
    return got, [p.take(piece, lambda pcm, fmt: got.append((pcm, fmt))) for piece in pieces]


def samples(data: bytes) -> bytes:
    header = pcm_header(data)
    assert header is not None
    return data[header.offset:]


def refusing_once(got: list[bytes]) -> Callable[[bytes, PcmFormat], None]:
    """An append whose first call is refused as a full backlog (429), then takes."""
    calls = []

    def append(pcm: bytes, fmt: PcmFormat) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise AudioInputError("full", param="audio", code="session_backlog_full")
        got.append(pcm)
    return append


@pytest.mark.parametrize("first", [1, 4, 8, 11])
def test_a_first_piece_shorter_than_the_signature_waits_for_the_rest(first: int) -> None:
    # `RIFF` alone (4 bytes) was no WAV: on the socket read as f32le, over HTTP the next chunk decoded as a file
    data = piped("wav", "pcm_s16le", wave_tone(0.2, 16000), 16000)
    got, rests = run([data[:first], data[first:200], data[200:]])
    assert rests == [None, None, None]
    assert b"".join(pcm for pcm, _ in got) == samples(data)[:len(samples(data)) // 2 * 2]


def test_a_short_piece_that_is_no_signature_is_returned_with_the_next() -> None:
    got, rests = run([b"RIFF", b"\x00" * 4 + b"AVI LIST", b"\x01\x02"])
    assert got == [] and rests == [None, b"RIFF" + b"\x00" * 4 + b"AVI LIST", b"\x01\x02"]
    assert run([b"\x01\x02\x03"])[1] == [b"\x01\x02\x03"]  # no signature's start: as it came


@pytest.mark.parametrize("cut", [30, 31, 44])
def test_a_refused_chunk_that_completes_a_split_header_is_read_the_same_when_sent_again(cut: int) -> None:
    # cut at 31: the retry fed the header's last byte as a sample (s16 one byte off: noise to the end)
    data = piped("wav", "pcm_s16le", wave_tone(0.2, 16000), 16000)
    got: list[bytes] = []
    p, append = PipedPcm("audio"), refusing_once(got)
    assert p.take(data[:cut], append) is None
    with pytest.raises(AudioInputError):
        p.take(data[cut:1030], append)
    assert p.take(data[cut:1030], append) is None
    assert b"".join(got) == samples(data[:1030])


def test_a_header_cut_short_then_another_stream_is_dropped_for_that_stream() -> None:
    # after a 30-byte header the WebM's chunks were taken as its rest, each a silent 200, until 64 KiB
    wav = piped("wav", "pcm_s16le", wave_tone(0.2, 16000), 16000)
    webm = piped("webm", "libopus", wave_tone(2.0, 48000), 48000)
    pieces = [webm[at:at + 4000] for at in range(0, len(webm), 4000)]
    got, rests = run([wav[:30], *pieces])
    assert got == [] and rests == [None, *pieces]


def riff(chunks: list[tuple[bytes, bytes]], size: int | None = None) -> bytes:
    body = b"WAVE" + b"".join(c + struct.pack("<I", len(d)) + d + b"\0" * (len(d) & 1) for c, d in chunks)
    return b"RIFF" + struct.pack("<I", len(body) if size is None else size) + body


ULAW = struct.pack("<HHIIHH", 7, 1, 8000, 8000, 1, 8)


@pytest.mark.parametrize("size", [None, 0, 0xFFFFFFFF])
def test_a_wav_of_known_samples_ends_after_its_trailing_chunks_whatever_its_riff_size(size: int | None) -> None:
    # with its RIFF size unknown (0, 0xFFFFFFFF) every chunk after its samples was taken and dropped, each a 200
    body = bytes(range(1, 256)) * 4 + b"\x7f"  # 1021 bytes: odd, so padded
    data = riff([(b"fmt ", ULAW), (b"data", body), (b"LIST", b"INFOICMT\x03\0\0\0ab\0")], size)
    raw = b"\x11\x22" * 50
    got, rests = run([data[:300], data[300:], raw])
    assert b"".join(pcm for pcm, _ in got) == body and rests == [None, None, raw]


def test_the_retry_of_a_chunk_straddling_a_wavs_end_reads_the_same_bytes_the_same_way() -> None:
    # its part after the WAV refused (429), the retry was read whole as raw PCM: the WAV's last samples twice
    body = bytes(range(1, 201)) * 5
    data = riff([(b"fmt ", ULAW), (b"data", body)])
    raw = b"\x11\x22" * 50
    got: list[tuple[bytes, PcmFormat]] = []
    p = PipedPcm("audio")
    assert p.take(data[:500], lambda pcm, fmt: got.append((pcm, fmt))) is None
    assert p.take(data[500:] + raw, lambda pcm, fmt: got.append((pcm, fmt))) == raw  # the caller refuses `raw`
    assert p.take(data[500:] + raw, lambda pcm, fmt: got.append((pcm, fmt))) == raw  # its retry
    assert b"".join(pcm for pcm, _ in got) == body
    assert p.take(raw, lambda pcm, fmt: got.append((pcm, fmt))) == raw


def test_the_retry_of_a_refused_whole_file_whose_header_was_held_back_is_the_whole_file() -> None:
    data = riff([(b"fmt ", ULAW), (b"data", b"\x01" * 400)])
    got, rests = run([data[:20], data[20:], data[20:]])
    assert got == [] and rests == [None, data, data]


@pytest.mark.parametrize("options, codec, channels", [({"rf64": "always"}, "pcm_s16le", 1),
                                                      ({}, "pcm_f32le", 2), ({"write_bext": "1"}, "pcm_s16le", 1)])
def test_ffmpegs_own_variants_in_pieces(options: dict[str, str], codec: str, channels: int) -> None:
    data = piped("wav", codec, wave_tone(0.3, 16000), 16000, channels, options=options)
    header = pcm_header(data)
    assert header is not None and header.format is not None
    got, _ = run([data[at:at + 777] for at in range(0, len(data), 777)])
    assert b"".join(pcm for pcm, _ in got) == samples(data) and {fmt for _, fmt in got} == {header.format}
