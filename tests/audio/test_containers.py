"""audio/containers.py: a body's container known by its signature, whatever type it was declared, and raw PCM
(speech, silence, a sample of -1, noise) never taken for one."""

from __future__ import annotations


import numpy as np
import pytest

from audio.containers import container_kind, signature_start
from audio.pcm import reads_as_raw_pcm
from tests.audio.test_pcm import _encode, _wav, sine

SR = 16000


def _without_id3(mp3: bytes) -> bytes:
    """An mp3 as a bare stream of frames: its ID3v2 tag (size synchsafe in bytes 6-9) cut off."""
    assert mp3[:3] == b"ID3"
    size = (mp3[6] << 21) | (mp3[7] << 14) | (mp3[8] << 7) | mp3[9]
    return mp3[10 + size:]


@pytest.mark.parametrize("container, codec, rate, kind", [
    ("flac", "flac", 48000, "flac"), ("ogg", "libopus", 48000, "ogg"), ("mp3", "libmp3lame", 44100, "mp3"),
    ("ipod", "aac", 48000, "mp4"), ("webm", "libopus", 48000, "matroska"), ("adts", "aac", 48000, "aac"),
    ("aiff", "pcm_s16be", 16000, "aiff"), ("au", "pcm_mulaw", 8000, "au"),
])
def test_encoded_files_are_known_by_their_signature(container: str, codec: str, rate: int, kind: str) -> None:
    import av

    try:
        data = _encode(container, codec, rate, sine(440, 1.0, rate))
    except (av.error.FFmpegError, ValueError) as exc:
        pytest.skip(f"this PyAV build cannot encode {codec}: {exc}")
    assert container_kind(data) == kind
    if kind == "mp3":
        assert container_kind(_without_id3(data)) == "mp3"  # by three frame headers in a row


def test_a_wav_declared_as_raw_pcm_is_read_as_a_wav() -> None:
    wav = _wav(SR, sine(300, 0.5, SR) * 32767)
    assert container_kind(wav) == "wav"
    for declared in ("audio/L16;rate=16000", "audio/pcm", "audio/pcm;rate=24000;encoding=s16le"):
        assert not reads_as_raw_pcm(declared, wav)
    assert reads_as_raw_pcm("audio/pcm", wav[44:])  # its samples alone are raw


def test_an_au_file_declared_as_audio_basic_is_read_as_a_file() -> None:
    au = _encode("au", "pcm_mulaw", 8000, sine(300, 0.5, 8000))  # Sun's .au: `audio/basic` is its usual type
    samples = au[int.from_bytes(au[4:8], "big"):]  # past the header, whose offset it gives
    assert not reads_as_raw_pcm("audio/basic", au) and reads_as_raw_pcm("audio/basic", samples)


@pytest.mark.parametrize("name, body", [
    ("speech s16le", (sine(300, 0.5, SR) * 32767).astype("<i2").tobytes()),
    ("speech f32le", sine(300, 0.5, SR).astype("<f4").tobytes()),
    ("speech s16be", (sine(300, 0.5, SR) * 32767).astype(">i2").tobytes()),
    ("silence", bytes(32000)),
    ("-1 samples, an MPEG frame sync", np.full(16000, -1, "<i2").tobytes()),
    ("a sample of -1 then speech", np.concatenate([[-1, 0x6490 - 0x8000], (sine(300, 0.5, SR) * 9000)]).astype(
        "<i2").tobytes()),
])
def test_raw_pcm_is_no_container(name: str, body: bytes) -> None:
    assert container_kind(body) is None and reads_as_raw_pcm("audio/pcm;encoding=s16le", body), name


def test_noise_is_no_container() -> None:
    rng = np.random.default_rng(0)
    heads = [rng.integers(0, 256, 4096, dtype=np.uint8).tobytes() for _ in range(2000)]
    heads += [b"\xff\xfb" + h[2:] for h in heads[:500]]  # a frame sync first: its next header is noise
    assert all(container_kind(h) is None for h in heads)


@pytest.mark.parametrize("body, start", [
    (b"R", True), (b"RIFF", True), (b"RIFF\xff\xff\xff\xffWAV", True), (b"RF64", True), (b".sn", True),
    (b"\x1a\x45\xdf", True), (b"\0\0\0\x18fty", True), (b"Og", True),
    (b"RIFF\xff\xff\xff\xffWAVE", False),  # whole: container_kind knows it
    (b"RIFF\xff\xff\xff\xffAVI", False), (b"RIFX", False), (b"\0\0\0", False), (b"", False), (b"\x01\x02", False)])
def test_a_signature_cut_short_is_told(body: bytes, start: bool) -> None:
    # a pipe's first read may end inside `RIFF....WAVE`: the piece waits for the rest (audio/piped_pcm.py)
    assert signature_start(body) is start
