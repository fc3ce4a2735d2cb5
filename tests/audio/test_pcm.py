"""audio/pcm.py: raw PCM bodies, containers through PyAV, soxr resampling, and the bad inputs."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from audio.pcm import (
    AudioInputError,
    PcmFormat,
    RAW_PCM_TYPES,
    PcmStream,
    decode_container,
    decode_raw_pcm,
    is_raw_pcm,
    load_audio_file,
    parse_pcm_content_type,
    resample,
)
from audio.g711 import Law, decode_g711
from tests.fixtures.g711 import encode_g711

SR = 16000


def sine(freq: float, seconds: float, rate: int) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * freq * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def peak_hz(x: np.ndarray, rate: int = SR) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / rate)[np.argmax(spectrum)])


def test_parse_content_type_defaults_and_params() -> None:
    assert parse_pcm_content_type("audio/pcm") == PcmFormat(16000, "f32le", 1)
    assert parse_pcm_content_type("audio/pcm;rate=48000;encoding=s16le") == PcmFormat(48000, "s16le", 1)
    assert parse_pcm_content_type("audio/pcm; rate=8000; channels=2").channels == 2
    assert parse_pcm_content_type("audio/L16;rate=22050").encoding == "s16be"  # RFC 2586: network byte order
    assert parse_pcm_content_type("audio/L16;rate=22050;encoding=s16le").encoding == "s16le"
    assert parse_pcm_content_type("audio/pcm;rate=8000;").rate == 8000  # a trailing ";" names nothing
    assert is_raw_pcm("audio/pcm;rate=16000") and not is_raw_pcm("audio/wav")


@pytest.mark.parametrize("ct, fmt", [
    ("audio/pcmu", PcmFormat(8000, "ulaw")),  # RFC 3551's names, 8 kHz unless a rate is given
    ("audio/PCMA", PcmFormat(8000, "alaw")),
    ("audio/basic", PcmFormat(8000, "ulaw")),  # RFC 2046: 8 kHz μ-law
    ("audio/pcmu;rate=16000", PcmFormat(16000, "ulaw")),
    ("audio/pcm;encoding=ulaw", PcmFormat(8000, "ulaw")),  # G.711's own rate is the default for its encodings
    ("audio/pcm;encoding=pcm_alaw;rate=11025", PcmFormat(11025, "alaw")),
    ("audio/x-mulaw", PcmFormat(8000, "ulaw")),  # telephony's names (Asterisk, Twilio): the same G.711
    ("audio/mulaw;rate=8000", PcmFormat(8000, "ulaw")),
    ("audio/X-ALAW;rate=8000", PcmFormat(8000, "alaw")),
    ("audio/alaw", PcmFormat(8000, "alaw")),
    ("audio/x-mulaw;rate=16000", PcmFormat(16000, "ulaw")),  # a rate as audio/pcmu's
    ("audio/pcmu;encoding=ulaw", PcmFormat(8000, "ulaw")),  # its own encoding, by any of its names
    ("audio/x-mulaw;encoding=pcm_mulaw", PcmFormat(8000, "ulaw")),
    ("audio/alaw;encoding=ALAW", PcmFormat(8000, "alaw")),
])
def test_g711_content_types(ct: str, fmt: PcmFormat) -> None:
    assert is_raw_pcm(ct) and parse_pcm_content_type(ct) == fmt
    assert fmt.sample_bytes == 1


@pytest.mark.parametrize("law", ["ulaw", "alaw"])
def test_g711_bodies_decode_to_the_signal(law: Law) -> None:
    x = sine(440, 0.5, 8000)
    body = encode_g711(x, law)
    fmt = parse_pcm_content_type(f"audio/pcm{law[0]}")
    y = decode_raw_pcm(body, fmt)
    np.testing.assert_array_equal(y, resample(decode_g711(body, law).astype(np.float32) / 32768, 8000))
    assert abs(len(y) - SR // 2) <= 1 and abs(peak_hz(y) - 440) < 3
    np.testing.assert_allclose(y[100:-100], resample(x, 8000)[100:-100], atol=0.02)  # within G.711's steps
    stream = PcmStream(fmt)  # one byte a sample: any byte count is whole samples
    assert stream.push(body[:801]).dtype == np.float32 and stream.push(body[801:1600]).size > 0


@pytest.mark.parametrize("ct", [
    "audio/x-mulaw;encoding=alaw", "audio/x-alaw;encoding=ulaw", "audio/pcmu;encoding=alaw",
    "audio/x-mulaw;encoding=s16le", "audio/basic;encoding=f32le", "audio/pcma;encoding=mulaw",
])
def test_an_encoding_its_g711_type_contradicts_is_refused(ct: str) -> None:
    # They were read as the parameter said: audio/x-mulaw;encoding=alaw as A-law, in silence.
    with pytest.raises(AudioInputError) as err:
        parse_pcm_content_type(ct)
    assert err.value.param == "encoding" and err.value.code == "invalid_content_type"
    assert "contradicts " + ct.split(";")[0] in str(err.value), err.value


@pytest.mark.parametrize("ct, code", [
    ("audio/pcm;rate=7999", "unsupported_sample_rate"),
    ("audio/pcm;rate=96000", "unsupported_sample_rate"),
    ("audio/pcm;rate=abc", "invalid_content_type"),
    ("audio/pcm;encoding=u8", "invalid_content_type"),
    ("audio/pcm;rate=16000;samplerate=48000", "invalid_content_type"),  # not read as 16 kHz in silence
    ("audio/pcm;rate=16000;rate=8000", "invalid_content_type"),  # was read as 8 kHz: the last one won
    ("audio/pcm;rate=١٦٠٠٠", "invalid_content_type"),  # Arabic-Indic digits: int() read them as 16000
    ("audio/pcm;rate=16_000", "invalid_content_type"),
    ("audio/pcm;channels=+2", "invalid_content_type"),
])
def test_parse_content_type_rejects(ct: str, code: str) -> None:
    with pytest.raises(AudioInputError) as err:
        parse_pcm_content_type(ct)
    assert err.value.code == code


def test_f32_and_s16_bodies_decode_to_the_same_signal() -> None:
    x = sine(440, 0.5, SR)
    f32 = decode_raw_pcm(x.astype("<f4").tobytes(), PcmFormat())
    s16 = decode_raw_pcm((x * 32767).astype("<i2").tobytes(), PcmFormat(encoding="s16le"))
    np.testing.assert_array_equal(f32, x)
    np.testing.assert_allclose(s16, x, atol=1e-4)


def test_l16_bodies_are_big_endian() -> None:
    x = sine(440, 0.5, SR)
    big = (x * 32767).astype(">i2").tobytes()
    np.testing.assert_allclose(decode_raw_pcm(big, parse_pcm_content_type("audio/L16")), x, atol=1e-4)
    stream = PcmStream(parse_pcm_content_type("audio/L16;rate=16000"))  # chunks of a live session too
    np.testing.assert_allclose(stream.push(big), x, atol=1e-4)


def test_stereo_is_downmixed() -> None:
    x = sine(440, 0.1, SR)
    stereo = np.stack([x, x], axis=1).reshape(-1)
    np.testing.assert_allclose(decode_raw_pcm(stereo.astype("<f4").tobytes(), PcmFormat(channels=2)), x, atol=1e-7)


@pytest.mark.parametrize("body, fmt, code", [
    (b"", PcmFormat(), "empty_audio"),
    (b"\x00" * 6, PcmFormat(), "invalid_pcm_length"),
    (b"\x00" * 3, PcmFormat(encoding="s16le"), "invalid_pcm_length"),
    (np.array([0.0, np.nan], "<f4").tobytes(), PcmFormat(), "invalid_samples"),
    (np.array([np.inf, 0.0], "<f4").tobytes(), PcmFormat(), "invalid_samples"),
])
def test_bad_raw_bodies(body: bytes, fmt: PcmFormat, code: str) -> None:
    with pytest.raises(AudioInputError) as err:
        decode_raw_pcm(body, fmt)
    assert err.value.code == code
    with pytest.raises(AudioInputError) as named:  # an upload's part names itself, not "body"
        decode_raw_pcm(body, fmt, param="file")
    assert named.value.param == "file"


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000])
def test_resampling_keeps_a_sines_frequency_and_length(rate: int) -> None:
    y = resample(sine(1000, 1.0, rate), rate)
    assert abs(len(y) - SR) <= 2
    assert abs(peak_hz(y) - 1000) < 3


def test_resampling_removes_content_above_nyquist() -> None:
    y = resample(sine(11000, 1.0, 48000), 48000)  # 11 kHz cannot exist at 16 kHz; decimation would alias to 5 kHz
    assert np.sqrt(np.mean(y[1000:-1000] ** 2)) < 0.01


def test_stream_chunks_match_one_shot_resampling() -> None:
    x = sine(300, 2.0, 48000)
    body = (x * 32767).astype("<i2").tobytes()
    stream = PcmStream(PcmFormat(48000, "s16le"))
    chunk = 48000 // 4 * 2  # 250 ms of s16
    parts = [stream.push(body[i:i + chunk]) for i in range(0, len(body), chunk)] + [stream.flush()]
    y = np.concatenate(parts)
    whole = decode_raw_pcm(body, PcmFormat(48000, "s16le"))
    assert abs(len(y) - len(whole)) <= 2
    n = min(len(y), len(whole))
    np.testing.assert_allclose(y[200:n - 200], whole[200:n - 200], atol=2e-3)


def test_a_bad_chunk_leaves_the_stream_usable() -> None:
    stream = PcmStream(PcmFormat(48000))
    with pytest.raises(AudioInputError):
        stream.push(b"\x00" * 5)
    assert stream.push(sine(300, 0.25, 48000).tobytes()).dtype == np.float32


def _encode(container: str, codec: str, rate: int, x: np.ndarray) -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.layout = "mono"
        fmt = stream.codec_context.format.name if stream.codec_context.format else "s16"
        frame_size = stream.codec_context.frame_size or 1024
        pcm = {"s16": (x * 32767).astype(np.int16), "s32": (x * 2**31 * 0.99).astype(np.int32)}.get(
            fmt[:3], x.astype(np.float32))
        for i in range(0, len(pcm), frame_size):
            piece = pcm[i:i + frame_size]
            frame = av.AudioFrame.from_ndarray(piece.reshape(1, -1), format=fmt, layout="mono")
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


@pytest.mark.parametrize("container, codec, rate", [
    ("wav", "pcm_s16le", 16000), ("wav", "pcm_s16le", 44100), ("flac", "flac", 48000),
    ("ogg", "libopus", 48000), ("mp3", "libmp3lame", 44100), ("ipod", "aac", 48000),
    ("webm", "libopus", 48000),
])
def test_containers_decode_to_16k_mono(container: str, codec: str, rate: int) -> None:
    import av

    try:
        data = _encode(container, codec, rate, sine(440, 1.0, rate))
    except (av.error.FFmpegError, ValueError) as exc:
        pytest.skip(f"this PyAV build cannot encode {codec}: {exc}")
    y = decode_container(data)
    assert y.dtype == np.float32 and y.ndim == 1
    assert 0.9 * SR <= len(y) <= 1.2 * SR
    assert abs(peak_hz(y[2000:14000]) - 440) < 5


@pytest.mark.parametrize("data, code", [
    (b"", "empty_audio"),
    (b"this is not audio at all" * 20, "unsupported_or_corrupt_audio"),
    (b"RIFF\x10\x00\x00\x00WAVEfmt " + b"\xff" * 30, "unsupported_or_corrupt_audio"),
])
def test_corrupt_or_empty_files_are_rejected(data: bytes, code: str) -> None:
    with pytest.raises(AudioInputError) as err:
        decode_container(data)
    assert err.value.code in (code, "empty_audio", "no_audio_stream")


def test_an_undecodable_body_is_told_which_types_are_read_as_raw_samples() -> None:
    """Raw μ-law labelled `audio/x-mulaw` met a bare "not an audio format this server reads": which types are?"""
    with pytest.raises(AudioInputError) as err:
        decode_container(encode_g711(sine(440, 1.0, 8000), "ulaw"))
    assert err.value.code == "unsupported_or_corrupt_audio"
    assert all(kind in str(err.value).lower() for kind in RAW_PCM_TYPES), str(err.value)


def _wav(rate: int, samples: np.ndarray, bits: int = 16, channels: int = 1) -> bytes:
    """A canonical PCM WAV with whatever header values a client may write."""
    import struct

    data = samples.astype("<i2").tobytes()
    block = channels * bits // 8
    return (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt "
            + struct.pack("<IHHIIHH", 16, 1, channels, rate, rate * block, block, bits)
            + b"data" + struct.pack("<I", len(data)) + data)


def test_a_file_claiming_an_absurd_sample_rate_is_refused_before_resampling() -> None:
    # 20,000 samples "at 1 Hz" would be resampled to 5.5 hours at 16 kHz (the probe's 300 KB upload killed a worker).
    with pytest.raises(AudioInputError) as err:
        decode_container(_wav(1, np.zeros(20000)))
    assert (err.value.code, err.value.param) == ("unsupported_sample_rate", "file")
    assert decode_container(_wav(8000, np.zeros(8000))).size == SR  # a real low rate still decodes


def test_audio_longer_than_the_limit_is_refused_while_it_decodes() -> None:
    wav = _wav(16000, np.zeros(16000 * 5))
    assert decode_container(wav, max_seconds=5.0).size == 5 * SR
    with pytest.raises(AudioInputError) as err:
        decode_container(wav, max_seconds=2.0, param="body")
    assert (err.value.code, err.value.param) == ("audio_too_long", "body")
    raw = np.zeros(16000 * 3, "<f4").tobytes()
    assert decode_raw_pcm(raw, PcmFormat(), max_seconds=3.0).size == 3 * SR
    with pytest.raises(AudioInputError) as err:
        decode_raw_pcm(raw, PcmFormat(), max_seconds=2.5)
    assert err.value.code == "audio_too_long"


def test_a_header_pyav_cannot_describe_is_a_corrupt_file() -> None:
    # 36-bit samples in three channels: PyAV opens it and then fails on the stream (an AttributeError, once a 500).
    with pytest.raises(AudioInputError) as err:
        decode_container(_wav(8000, np.zeros(60), bits=36, channels=3))
    assert err.value.code in ("unsupported_or_corrupt_audio", "empty_audio", "no_audio_stream")


def _multichannel_wav(x: np.ndarray, layout: str, rate: int = 44100) -> bytes:
    """A pcm_s16le WAV whose every channel holds `x`."""
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="wav") as out:
        stream = out.add_stream("pcm_s16le", rate=rate)
        stream.layout = layout
        channels = stream.codec_context.layout.nb_channels
        pcm = np.repeat((x * 32767).astype(np.int16), channels).reshape(1, -1)  # packed: frame by frame
        frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout=layout)
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buf.getvalue()


@pytest.mark.parametrize("layout", ["stereo", "5.1"])
def test_multichannel_files_decode_as_loud_as_the_mono_file(layout: str) -> None:
    # FFmpeg's down-mix kept power: identical channels came out x1.41 (stereo) and x3.41 (5.1), past full scale.
    x = sine(440, 1.0, 44100) * 0.9
    mono = decode_container(_multichannel_wav(x, "mono"))
    mixed = decode_container(_multichannel_wav(x, layout))
    assert mixed.shape == mono.shape
    np.testing.assert_allclose(mixed, mono, atol=1e-4)
    assert np.abs(mixed).max() < 1.0


def test_an_undecodable_file_is_named_in_plain_words() -> None:
    with pytest.raises(AudioInputError) as err:
        decode_container(b"this is not audio at all" * 20)
    message = str(err.value)
    assert "could not decode the audio file" in message
    assert "Errno" not in message and "<none>" not in message and "1094995529" not in message


def test_an_empty_file_on_disk_is_called_empty(tmp_path: Path) -> None:
    empty = tmp_path / "zero.wav"
    empty.write_bytes(b"")
    with pytest.raises(AudioInputError) as err:
        load_audio_file(empty)
    assert (err.value.code, str(err.value)) == ("empty_audio", "the file is empty")


def _silent_flac(rate: int, seconds: int) -> bytes:
    """Digital silence as FLAC, encoded a second at a time: a few kB however long and however high its rate."""
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="flac") as out:
        stream = out.add_stream("flac", rate=rate)
        stream.layout = "mono"
        second = np.zeros((1, rate), np.int16)
        for i in range(seconds):
            frame = av.AudioFrame.from_ndarray(second, format="s16", layout="mono")
            frame.sample_rate, frame.pts = rate, i * rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def test_a_high_rate_file_holds_only_its_16k_samples_while_it_decodes() -> None:
    import tracemalloc

    # 20 s at 384 kHz (a few kB of FLAC) held 61 MB at its own rate, then a copy of it, before soxr resampled it
    # (the probe's 10 MB of 2 h silence would have needed ~24 GB); now frames are resampled as they arrive.
    data = _silent_flac(384000, 20)
    assert len(data) < 200_000
    tracemalloc.start()
    try:
        y = decode_container(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert y.size == 20 * SR and not y.any()
    assert peak < 2.5 * y.nbytes + 2**20, f"{peak / 1e6:.1f} MB held for {y.nbytes / 1e6:.1f} MB of output"


@pytest.mark.parametrize("rate", [16000, 44100, 384000])
def test_frames_resampled_as_they_arrive_match_resampling_the_whole(rate: int) -> None:
    import av

    x = sine(440, 2.0, rate) * np.linspace(0.1, 1.0, 2 * rate, dtype=np.float32)
    try:
        data = _encode("flac", "flac", rate, x)
    except (av.error.FFmpegError, ValueError) as exc:
        pytest.skip(f"this PyAV build cannot encode flac at {rate} Hz: {exc}")
    whole = resample((x * 32767).astype(np.int16).astype(np.float32) / 32768, rate)  # the one-shot path
    np.testing.assert_allclose(decode_container(data), whole, atol=1e-6)


@pytest.mark.parametrize("container, codec", [("wav", "pcm_s16le"), ("ipod", "aac")])
def test_a_pipe_is_read_as_a_file_is(container: str, codec: str, tmp_path: Path) -> None:
    # `tandem transcribe <(cat x.wav)` and /dev/stdin are pipes: once refused as "no such audio file". An m4a's
    # index comes after its audio, which FFmpeg cannot seek back to in a pipe: the pipe is read whole first.
    import os
    import threading

    import av

    try:
        data = _encode(container, codec, 44100, sine(440, 10.0, 44100))  # 10 s: FFmpeg's buffer no longer holds it
    except (av.error.FFmpegError, ValueError) as exc:
        pytest.skip(f"this PyAV build cannot encode {codec}: {exc}")
    fifo = tmp_path / "audio.pipe"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as f:
            f.write(data)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        y = load_audio_file(fifo)
    finally:
        if writer.is_alive():  # the read failed before opening: let the writer finish
            with open(fifo, "rb") as f:
                f.read()
        writer.join()
    np.testing.assert_array_equal(y, decode_container(data))
