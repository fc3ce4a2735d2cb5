"""audio/container_chunks.py: the rule a session's container chunks follow — a header starts a stream (the one before
closed, its tail first), a headerless chunk continues the open stream or is refused saying what it looks like, whole
files (WAV, a plain MP4) are decoded whole, a first piece too short to tell waits for the next, and none opens once the
session is gone."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest

from audio.container_chunks import ContainerChunks, _fragmented_mp4, opens_stream
from audio.errors import AudioInputError, SessionClosed
from audio.pcm import decode_container
from tests.fixtures.container_streams import encode, pieces, tone


def wav(seconds: float, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((tone(seconds, rate) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def taken(chunks: ContainerChunks, body: bytes) -> np.ndarray:
    """As a session takes a chunk: the open stream's tail when `body` starts another, then `body`'s audio."""
    return np.concatenate([chunks.tail_before(body), chunks.decode(body)])


def test_a_header_starts_a_new_stream_after_the_tail_of_the_one_before() -> None:
    first, second = encode("webm", tone(2.0)), encode("ogg", tone(1.5))
    chunks = ContainerChunks()
    got = [taken(chunks, p) for p in [*pieces(first, 8), *pieces(second, 6)]]
    got.append(chunks.close())
    # in order, nothing lost: the WebM's held-back tail came before the Ogg's first samples
    np.testing.assert_array_equal(np.concatenate(got), np.concatenate([decode_container(first),
                                                                       decode_container(second)]))
    assert not chunks.open


def test_a_headerless_chunk_with_no_stream_open_is_refused_saying_what_it_looks_like() -> None:
    continuation = pieces(encode("webm", tone(2.0)), 8)[3]
    with pytest.raises(AudioInputError) as refused:
        ContainerChunks().decode(continuation)
    err = refused.value
    assert err.code == "missing_stream_header" and err.param == "body"
    assert "headerless continuation of a WebM, Ogg or MP4 stream" in err.message and "corrupt" not in err.message


def test_an_ogg_page_that_does_not_begin_its_stream_continues_it() -> None:
    data = encode("ogg", tone(1.0))
    third_page = data.index(b"OggS", data.index(b"OggS", 1) + 1)  # after the two header pages
    head, rest = data[:third_page], data[third_page:]
    assert opens_stream(head) and not opens_stream(rest)  # each page opens with OggS: only the first begins it
    with pytest.raises(AudioInputError, match="headerless continuation"):
        ContainerChunks().decode(rest)
    chunks = ContainerChunks()
    got = [taken(chunks, head), taken(chunks, rest), chunks.close()]
    np.testing.assert_array_equal(np.concatenate(got), decode_container(data))


def test_whole_files_are_decoded_whole_and_leave_no_stream_open() -> None:
    chunks = ContainerChunks()
    for body in (wav(0.5), wav(0.25, 8000), encode("plain_mp4", tone(1.0))):
        np.testing.assert_array_equal(taken(chunks, body), decode_container(body))  # all of it at once
        assert not chunks.open
    with pytest.raises(AudioInputError) as refused:
        chunks.decode(b"\x01\x02" * 100)
    assert refused.value.code == "missing_stream_header" and "was a whole file" in refused.value.message


def test_after_a_stream_failed_a_continuation_is_told_why_none_is_open() -> None:
    chunks = ContainerChunks()
    parts = pieces(encode("mp4", tone(2.0)), 8)
    taken(chunks, parts[0])
    with pytest.raises(AudioInputError) as bad:
        chunks.decode(b"\x00\x00\x00\x10junk" + bytes(range(256)) * 8)
    assert bad.value.code == "unsupported_or_corrupt_audio" and not chunks.open
    with pytest.raises(AudioInputError) as after:
        chunks.decode(parts[1])
    assert after.value.code == "missing_stream_header" and "could not be decoded" in after.value.message


def test_an_empty_chunk_is_refused() -> None:
    with pytest.raises(AudioInputError) as refused:
        ContainerChunks().decode(b"")
    assert refused.value.code == "empty_audio"


def test_a_fragmented_mp4_is_told_from_a_plain_one() -> None:
    fragmented, plain = encode("mp4", tone(1.0)), encode("plain_mp4", tone(1.0))
    assert _fragmented_mp4(fragmented) and _fragmented_mp4(fragmented[:200])  # Safari's first blob, or its start
    assert not _fragmented_mp4(plain)


def test_a_first_chunk_too_short_to_tell_its_container_waits_for_the_next() -> None:
    # 3 bytes of the EBML signature were refused as headerless, and so was every chunk after them
    data = encode("webm", tone(1.0))
    chunks = ContainerChunks()
    got = [taken(chunks, data[:3]), taken(chunks, data[3:5])]
    assert got[0].size == got[1].size == 0 and not chunks.open
    got += [taken(chunks, p) for p in pieces(data[5:], 4)]
    got.append(chunks.close())
    np.testing.assert_array_equal(np.concatenate(got), decode_container(data))


def test_a_stray_short_chunk_is_dropped_by_a_next_one_that_opens_a_stream() -> None:
    # a 3-byte blob glued itself in front of the next stream's header chunk: it and every chunk after it refused
    data = encode("ogg", tone(1.0))
    chunks = ContainerChunks()
    assert chunks.decode(b"\x00\x01\x02").size == 0
    got = [taken(chunks, p) for p in pieces(data, 4)]
    got.append(chunks.close())
    np.testing.assert_array_equal(np.concatenate(got), decode_container(data))


def test_a_short_chunk_and_the_next_that_make_no_stream_are_refused_saying_so() -> None:
    chunks = ContainerChunks()
    assert chunks.decode(b"\x00\x01\x02").size == 0
    with pytest.raises(AudioInputError, match="after the 3 bytes of the short chunk before it") as refused:
        chunks.decode(pieces(encode("webm", tone(1.0)), 4)[2])
    assert refused.value.code == "missing_stream_header"


def test_a_short_chunk_held_is_dropped_at_close_and_abort() -> None:
    # raw PCM appended meanwhile closes (audio/sessions.py _close_stream_here): the next chunk is no more its rest
    webm = encode("webm", tone(1.0))
    for end in ("close", "abort"):
        chunks = ContainerChunks()
        assert chunks.decode(webm[:3]).size == 0
        getattr(chunks, end)()
        assert chunks._short == b""
    chunks = ContainerChunks()
    chunks.decode(webm[:3])
    chunks.close()
    with pytest.raises(AudioInputError) as refused:
        chunks.decode(webm[3:])
    assert refused.value.code == "missing_stream_header"


def test_an_abort_under_a_feed_is_the_session_closed_and_no_stream_opens_after(monkeypatch: pytest.MonkeyPatch) -> None:
    # the session's cancel (the event loop) raced its worker thread: a 500, or a new decoder thread no one stopped
    parts = pieces(encode("webm", tone(1.0)), 4)
    chunks = ContainerChunks()
    chunks.decode(parts[0])
    stream = chunks._stream
    assert stream is not None
    feed = stream.feed

    def cancelled_meanwhile(data: bytes, max_seconds: float | None = None) -> np.ndarray:
        chunks.abort()
        return feed(data, max_seconds)

    monkeypatch.setattr(stream, "feed", cancelled_meanwhile)
    with pytest.raises(SessionClosed):
        chunks.decode(parts[1])
    with pytest.raises(SessionClosed):
        chunks.decode(parts[0])  # a header: no stream opens after the abort
    assert not chunks.open
