"""service/speech/socket_audio.py over a tiny random-init Whisper: a browser's MediaRecorder stream sent over
/v1/audio/live as binary frames (WebM, Ogg, fragmented MP4, the first frame carrying the header) is decoded as it
arrives and transcribed whole; a header mid-socket starts the next stream; and the format `session.created` announces,
echoed back in a `session.update`, is taken and reads the frames after it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from litestar.testing import TestClient

from audio.pcm import SAMPLE_RATE, decode_container
from service.app import create_app
from service.speech.setup import SpeechConfig, install_speech
from service.state import AppState
from tests.fixtures.container_streams import STREAM_KINDS, encode, pieces, tone
from tests.fixtures.tiny_whisper import build_tiny_whisper
from tests.service.speech.test_live_socket import until


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> AppState:
    whisper_dir: Path = build_tiny_whisper(tmp_path_factory.mktemp("tiny_whisper"))
    return install_speech(AppState(), SpeechConfig(model=str(whisper_dir), resident=True, max_sessions=3))


@pytest.fixture(scope="module")
def client(state: AppState) -> Iterator[TestClient[Any]]:
    with TestClient(create_app(state)) as c:
        yield c


def streamed(client: TestClient[Any], frames: list[bytes]) -> list[dict[str, Any]]:
    """`frames` sent as binary messages over /v1/audio/live, then a finish: every event up to transcript.done."""
    with client.websocket_connect("/v1/audio/live?interval=0") as ws:
        assert ws.receive_json(timeout=30)["type"] == "session.created"
        for frame in frames:
            ws.send_bytes(frame)
        ws.send_text(json.dumps({"type": "finish"}))
        return until(ws, "transcript.done")


@pytest.mark.parametrize("name", STREAM_KINDS)
def test_a_mediarecorder_stream_sent_as_binary_frames_is_transcribed_whole(client: TestClient[Any],
                                                                           name: str) -> None:
    # read as f32le PCM, these frames were NaN errors and a "!!!!" transcript
    data = encode(name, tone(2.0))
    events = streamed(client, pieces(data, 8))
    assert [e for e in events if e["type"] == "error"] == []
    assert events[-1]["received_seconds"] == pytest.approx(len(decode_container(data)) / SAMPLE_RATE, abs=1e-3)


def test_a_header_mid_socket_starts_the_next_stream(client: TestClient[Any]) -> None:
    first, second = encode("webm", tone(1.5)), encode("ogg", tone(1.0))
    events = streamed(client, [*pieces(first, 6), *pieces(second, 4)])
    assert [e for e in events if e["type"] == "error"] == []
    both = len(decode_container(first)) + len(decode_container(second))
    assert events[-1]["received_seconds"] == pytest.approx(both / SAMPLE_RATE, abs=1e-3)


def test_a_headerless_first_frame_is_still_pcm_and_a_bad_continuation_an_error_event(client: TestClient[Any]) -> None:
    pcm = np.zeros(SAMPLE_RATE // 2, "<f4").tobytes()
    parts = pieces(encode("mp4", tone(1.0)), 4)
    events = streamed(client, [pcm, parts[0], b"\x00\x00\x00\x10junk" + bytes(range(256)) * 8, parts[1]])
    errors = [e for e in events if e["type"] == "error"]
    assert [e["code"] for e in errors] == ["unsupported_or_corrupt_audio", "missing_stream_header"]
    assert errors[0]["param"] == "audio" and "MP4 stream" in errors[0]["message"]
    assert events[-1]["received_seconds"] > 0.5  # the PCM and the stream's first piece were kept


@pytest.mark.parametrize("query, encoding, rate", [("?rate=48000", "f32le", 48000),
                                                   ("?rate=24000&encoding=s16le", "s16le", 24000),
                                                   ("?encoding=ulaw", "ulaw", 8000)])
def test_the_format_announced_echoed_in_an_update_is_taken(client: TestClient[Any], state: AppState, query: str,
                                                           encoding: str, rate: int) -> None:
    with client.websocket_connect(f"/v1/audio/live{query}") as ws:
        announced = ws.receive_json(timeout=30)["session"]["audio"]["input"]["format"]
        assert announced["encoding"] == encoding
        ws.send_text(json.dumps({"type": "session.update", "session": {
            "type": "transcription", "audio": {"input": {"format": announced, "turn_detection": None}}}}))
        updated = until(ws, "session.updated")[-1]["session"]["audio"]["input"]["format"]
        assert updated["rate"] == rate if "rate" in updated else rate == 8000
        (session,) = [s for s in state.speech.sessions.values() if not s.closed]  # type: ignore[union-attr]
        width = {"f32le": 4, "s16le": 2, "ulaw": 1}[encoding]
        ws.send_bytes(b"\0" * (rate // 2 * width))  # half a second in the announced format
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit"}))
        until(ws, "input_audio_buffer.committed")
        assert session.received_seconds == pytest.approx(0.5, abs=0.03)


def test_a_streams_tail_is_counted_in_the_audio_seconds(client: TestClient[Any], state: AppState) -> None:
    # /metrics counted each frame's audio: the tail its decoder held back until the finish was left out
    before = float(state.metrics.registry.get_sample_value("tandem_whisper_audio_seconds_total") or 0.0)
    events = streamed(client, pieces(encode("webm", tone(1.0)), 4))
    after = float(state.metrics.registry.get_sample_value("tandem_whisper_audio_seconds_total") or 0.0)
    assert after - before == pytest.approx(events[-1]["received_seconds"], abs=6e-4)  # rounded to ms
