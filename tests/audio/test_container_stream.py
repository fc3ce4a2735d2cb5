"""audio/container_stream.py: a MediaRecorder's stream (WebM, Ogg, fragmented MP4) decoded piece by piece gives the
whole file's samples, each piece's as it arrives; limits and corrupt pieces are refused, and so is a stream that takes
bytes without giving audio; no decoder thread outlives its stream."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from audio import container_stream
from audio.container_stream import ContainerStream
from audio.errors import AudioInputError
from audio.pcm import SAMPLE_RATE, decode_container
from tests.fixtures.container_streams import STREAM_KINDS, encode, pieces, tone

KINDS = {"webm": "matroska", "ogg": "ogg", "mp4": "mp4"}


def decoders() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("decode-")]


@pytest.mark.parametrize("name", STREAM_KINDS)
def test_pieces_decode_as_they_arrive_to_the_whole_files_samples(name: str) -> None:
    data = encode(name, tone(3.0))
    stream = ContainerStream(KINDS[name])
    got = [stream.feed(piece) for piece in pieces(data, 12)]  # 250 ms each, as recorder.start(250) gives them
    tail = stream.close()
    assert got[0].size > 0  # the first piece, the one with the header, yields audio at once
    assert all(x.size > 0 for x in got[1:])  # and so does each continuation (they were refused as corrupt)
    assert tail.size < 0.05 * SAMPLE_RATE  # only the decoder's and resampler's delay waits for the close
    np.testing.assert_array_equal(np.concatenate([*got, tail]), decode_container(data))
    assert stream.ended and stream.error is None and not stream._thread.is_alive()


def test_a_chunk_decoding_to_more_than_max_seconds_is_refused_and_ends_the_stream() -> None:
    stream = ContainerStream("matroska")
    parts = pieces(encode("webm", tone(3.0)), 3)
    assert stream.feed(parts[0], max_seconds=2.0).size > 0
    with pytest.raises(AudioInputError) as refused:
        stream.feed(parts[1] + parts[2], max_seconds=1.0)  # ~2 s of audio in one chunk
    assert refused.value.code == "audio_too_long" and "1 s" in refused.value.message
    with pytest.raises(AudioInputError) as after:
        stream.feed(parts[2])
    assert after.value.code == "stream_ended"
    stream.close()


def test_a_corrupt_continuation_is_refused_naming_the_problem() -> None:
    parts = pieces(encode("mp4", tone(2.0)), 8)
    stream = ContainerStream("mp4")
    taken = [stream.feed(p) for p in parts[:3]]
    with pytest.raises(AudioInputError) as refused:
        stream.feed(b"\x00\x00\x00\x10junk" + bytes(range(256)) * 8)
    err = refused.value
    assert err.code == "unsupported_or_corrupt_audio" and err.param == "body"
    assert "could not decode the MP4 stream at this chunk" in err.message and "invalid data" in err.message
    assert sum(x.size for x in taken) > 0 and stream.ended  # what came before was handed out already
    stream.close()


def test_abort_and_close_end_the_decoder_thread() -> None:
    before = set(decoders())
    waiting = ContainerStream("ogg")  # blocked for its first byte
    fed = ContainerStream("matroska")
    fed.feed(pieces(encode("webm", tone(1.0)), 4)[0])  # blocked mid-stream
    assert len(set(decoders()) - before) == 2
    waiting.abort()
    assert fed.close().size >= 0 and not fed._thread.is_alive()  # close joins it
    waiting._thread.join(5)
    assert not waiting._thread.is_alive() and waiting.error is None  # an abort is no failure
    assert waiting.close().size == 0


def test_a_stream_closed_before_its_header_came_whole_gives_nothing() -> None:
    data = encode("webm", tone(1.0))
    stream = ContainerStream("matroska")
    assert stream.feed(data[:20]).size == 0  # the EBML header, cut short
    assert stream.close().size == 0 and stream.ended


def void(size: int) -> bytes:
    """An EBML Void element's head, `size` bytes of payload to follow: FFmpeg skips it by reading them."""
    return b"\xec\x01" + size.to_bytes(7, "big")


def test_a_header_that_never_ends_is_refused_past_a_mebibyte() -> None:
    # FFmpeg kept each 7 MB chunk of a header that never ended (Matroska attachments: +7 MB RSS each, no audio)
    data = encode("webm", tone(1.0))
    stream = ContainerStream("matroska")
    assert stream.feed(data[:data.index(b"\x16\x54\xae\x6b")] + void(8 << 20)).size == 0  # up to Tracks
    fed = 0
    with pytest.raises(AudioInputError) as refused:
        while fed < 8:
            fed += 1
            stream.feed(bytes(256 << 10))
    assert fed == 4 and refused.value.param == "body"  # past 1 MiB
    assert "gave no audio in its first 1048" in refused.value.message
    stream._thread.join(5)
    assert not stream._thread.is_alive()


def test_a_stream_that_stops_giving_audio_is_refused_as_lost() -> None:
    # a demuxer that lost its place (here: an element to skip that swallows the rest) took every later chunk in silence
    data = encode("webm", tone(20.0))
    at = [i for i in range(len(data)) if data.startswith(b"\x1f\x43\xb6\x75", i)][3]  # the 4th cluster
    stream = ContainerStream("matroska")
    assert stream.feed(data[:at]).size > 0
    stream.feed(void(8 << 20))
    rest = pieces(data[at:], 20)  # ~0.85 s each
    with pytest.raises(AudioInputError) as refused:
        for piece in rest:
            stream.feed(piece)
    assert "gave no audio in its last" in refused.value.message and "lost its place" in refused.value.message
    assert rest.index(piece) < 12  # after 10 s of the stream at its own rate, not at its end


def test_a_stream_taking_more_bytes_than_its_audio_accounts_for_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(container_stream, "_FIRST_AUDIO_BYTES", 16 << 10)
    monkeypatch.setattr(container_stream, "_BYTES_PER_SECOND", 1000)  # where the stream takes ~10 KB a second
    stream = ContainerStream("matroska")
    with pytest.raises(AudioInputError) as refused:
        for piece in pieces(encode("webm", tone(5.0)), 10):
            stream.feed(piece)
    assert "bytes for" in refused.value.message and "of audio (more than" in refused.value.message
