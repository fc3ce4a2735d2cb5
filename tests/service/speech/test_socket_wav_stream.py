"""/v1/audio/live (service/speech/socket_audio.py): a WAV or Sun .au written to a pipe and sent on as it is recorded
(`arecord -t wav -`, `ffmpeg … -f wav -`: the header in the first frame, often with a size of 0xFFFFFFFF, then the
samples) is read as PCM in the format its header gives. Since the container frames came (4500c74) the header frame
was decoded as a whole file and every frame after it refused `missing_stream_header`."""

from __future__ import annotations

import io
import json
import struct
import wave
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from litestar.testing import TestClient

from audio.pcm import SAMPLE_RATE
from audio.pcm_headers import pcm_header
from service.app import create_app
from service.speech.setup import SpeechConfig, install_speech
from service.state import AppState
from tests.fixtures.piped_audio import piped, wave_tone
from tests.fixtures.tiny_whisper import build_tiny_whisper
from tests.service.speech.test_live_socket import until


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient[Any]]:
    whisper_dir: Path = build_tiny_whisper(tmp_path_factory.mktemp("tiny_whisper"))
    state = install_speech(AppState(), SpeechConfig(model=str(whisper_dir), resident=True, max_sessions=3))
    with TestClient(create_app(state)) as c:
        yield c


def streamed(client: TestClient[Any], frames: list[bytes], query: str = "") -> list[dict[str, Any]]:
    """`frames` sent as binary messages, then a finish: every event up to transcript.done."""
    with client.websocket_connect(f"/v1/audio/live?interval=0{query}") as ws:
        assert ws.receive_json(timeout=30)["type"] == "session.created"
        for frame in frames:
            ws.send_bytes(frame)
        ws.send_text(json.dumps({"type": "finish"}))
        return until(ws, "transcript.done")


def errors(events: list[dict[str, Any]]) -> list[str]:
    return [e["code"] for e in events if e["type"] == "error"]


def cut(data: bytes, size: int) -> list[bytes]:
    return [data[at:at + size] for at in range(0, len(data), size)]


def test_a_streamed_wav_header_then_pcm_frames_is_all_taken(client: TestClient[Any]) -> None:
    # arecord -f S16_LE -r 16000 -t wav - (its header's sizes unknown), read 3200 bytes at a time
    pcm = (np.sin(np.arange(2 * SAMPLE_RATE) / 10) * 8000).astype("<i2").tobytes()  # 2 s at 16 kHz
    header = b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE" + b"fmt " + \
        struct.pack("<IHHIIHH", 16, 1, 1, SAMPLE_RATE, 2 * SAMPLE_RATE, 2, 16) + b"data" + struct.pack("<I", 0xFFFFFFFF)
    events = streamed(client, cut(header + pcm, 3200), "&encoding=s16le&rate=16000")
    assert errors(events) == []
    assert events[-1]["received_seconds"] == pytest.approx(2.0, abs=0.01)


@pytest.mark.parametrize("fmt, codec, rate, channels", [("wav", "pcm_s16le", 48000, 2), ("wav", "pcm_f32le", 16000, 1),
                                                        ("wav", "pcm_mulaw", 8000, 1), ("au", "pcm_s16be", 22050, 1)])
def test_the_header_says_how_the_frames_after_it_are_read_whatever_the_query(client: TestClient[Any], fmt: str,
                                                                             codec: str, rate: int,
                                                                             channels: int) -> None:
    data = piped(fmt, codec, wave_tone(1.5, rate), rate, channels)  # FFmpeg's own header, as `-f wav -` writes it
    header = pcm_header(data)
    assert header is not None
    # the header cut across two frames, then the samples in frames a pipe's reads cut anywhere (odd sizes too)
    frames = [data[:30], data[30:header.offset], *cut(data[header.offset:], 1001)]
    events = streamed(client, frames, "&encoding=s16le&rate=24000")  # the query says otherwise: the header wins
    assert errors(events) == []
    assert events[-1]["received_seconds"] == pytest.approx(1.5, abs=0.01)


@pytest.mark.parametrize("first", [4, 11])
def test_a_first_frame_shorter_than_the_wav_signature_waits_for_the_rest(client: TestClient[Any], first: int) -> None:
    # `RIFF` alone was read as f32le and every frame after it refused
    data = piped("wav", "pcm_s16le", wave_tone(1.5, 16000), 16000)
    events = streamed(client, [data[:first], *cut(data[first:], 3200)], "&rate=16000")
    assert errors(events) == []
    assert events[-1]["received_seconds"] == pytest.approx(1.5, abs=0.01)


def test_a_wav_sent_in_pieces_ends_where_its_header_says_and_a_new_header_starts_the_next(
        client: TestClient[Any]) -> None:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:  # a whole file, sizes known, and a trailing LIST chunk as some editors write
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(22050)
        w.writeframes((wave_tone(1.0, 22050) * 32767).astype("<i2").tobytes())
    comment = b"recorded at the meeting " * 170  # 4080 bytes: read as samples, 0.09 s of noise
    whole = buf.getvalue() + b"LIST" + struct.pack("<I", 12 + len(comment)) + b"INFOICMT" + \
        struct.pack("<I", len(comment)) + comment
    whole = whole[:4] + struct.pack("<I", len(whole) - 8) + whole[8:]  # the RIFF's size counts the LIST, as editors'
    restarted = piped("wav", "pcm_s16le", wave_tone(0.5, 44100), 44100)  # the recorder restarted mid-socket
    events = streamed(client, [*cut(whole, 4000), *cut(restarted, 4000)])
    assert errors(events) == []
    assert events[-1]["received_seconds"] == pytest.approx(1.5, abs=0.005)


def test_samples_that_cannot_be_read_in_pieces_are_refused_frame_by_frame_until_a_header_that_can(
        client: TestClient[Any]) -> None:
    wide = piped("wav", "pcm_s24le", wave_tone(0.5, 16000), 16000)
    fine = piped("wav", "pcm_s16le", wave_tone(1.0, 16000), 16000)
    whole = piped("wav", "pcm_s24le", wave_tone(0.25, 16000), 16000, file=True)  # one frame: FFmpeg reads it whole
    events = streamed(client, [*cut(wide, 8000), *cut(fine, 8000), whole])
    refused = [e for e in events if e["type"] == "error"]
    assert [e["code"] for e in refused] == ["unsupported_sample_format"] * len(cut(wide, 8000))
    assert refused[0]["param"] == "audio" and "24-bit PCM" in refused[0]["message"]
    assert events[-1]["received_seconds"] == pytest.approx(1.25, abs=0.01)  # never read as noise in another format
