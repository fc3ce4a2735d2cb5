"""Speech requests within limits: raw PCM parameters honoured on file uploads, part and websocket message
sizes, sessions reachable only with the key that created them, and fuzzed multipart bodies (4xx only)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from litestar.exceptions import WebSocketDisconnect
from litestar.testing import TestClient

from service.app import create_app
from service.config import ServiceConfig
from service.limits import Limits
from service.speech.setup import SpeechConfig, install_speech
from service.state import AppState
from tests.fixtures.tiny_whisper import build_tiny_whisper
from tests.service.speech.test_routes import voiced, wav_bytes

KEYS = ["alpha", "beta"]


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_whisper(tmp_path_factory.mktemp("tiny_whisper"))


@pytest.fixture(scope="module")
def client(whisper_dir: Path) -> Iterator[TestClient[Any]]:
    config = ServiceConfig(api_keys=KEYS, limits=Limits(max_part_bytes=400_000, max_ws_frame_bytes=100_000))
    state = install_speech(AppState(config=config), SpeechConfig(model=str(whisper_dir), resident=True))
    with TestClient(create_app(state)) as c:
        c.headers["x-api-key"] = KEYS[0]
        yield c


def _upload(client: TestClient[Any], body: bytes, content_type: str, **fields: str) -> Any:
    return client.post("/v1/audio/transcriptions", files={"file": ("a.raw", body, content_type)},
                       data={"response_format": "verbose_json", "temperature": "1.0", **fields})


@pytest.mark.parametrize("rate, encoding, dtype, scale", [(48000, "f32le", "<f4", 1.0), (8000, "s16le", "<i2", 32767.0)])
def test_raw_pcm_uploads_honour_rate_and_encoding(client: TestClient[Any], rate: int, encoding: str, dtype: str,
                                                  scale: float) -> None:
    seconds = 1.5
    t = np.arange(int(seconds * rate)) / rate
    samples = (0.3 * np.sin(2 * np.pi * 220 * t) * scale).astype(dtype).tobytes()
    answer = _upload(client, samples, f"audio/pcm;rate={rate};encoding={encoding}")
    assert answer.status_code == 200, answer.text
    assert answer.json()["duration"] == pytest.approx(seconds, abs=0.01)  # read at 16 kHz f32 it would not be


def test_a_part_over_the_limit_is_413_naming_it(client: TestClient[Any]) -> None:
    answer = _upload(client, b"\0" * 500_000, "audio/pcm")
    error = answer.json()["error"]
    assert answer.status_code == 413 and (error["param"], error["code"]) == ("file", "part_too_large")
    prompt = _upload(client, wav_bytes(voiced(0.5)), "audio/wav", prompt="p" * 500_000)
    assert prompt.status_code == 413 and prompt.json()["error"]["param"] == "prompt"


def test_sessions_answer_only_the_key_that_opened_them(client: TestClient[Any]) -> None:
    sid = client.post("/v1/audio/sessions", json={}).json()["id"]
    chunk = voiced(0.25).astype("<f4").tobytes()
    other = {"x-api-key": KEYS[1]}
    for call in (lambda h: client.post(f"/v1/audio/sessions/{sid}/audio", content=chunk, headers=h),
                 lambda h: client.post(f"/v1/audio/sessions/{sid}/finish", headers=h),
                 lambda h: client.delete(f"/v1/audio/sessions/{sid}", headers=h)):
        answer = call({**other, "content-type": "audio/pcm"})
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "session_not_found"
    assert client.post(f"/v1/audio/sessions/{sid}/audio", content=chunk,
                       headers={"content-type": "audio/pcm"}).status_code == 200
    assert client.delete(f"/v1/audio/sessions/{sid}").status_code == 200


def test_a_websocket_message_over_the_limit_gets_an_error_event_and_the_session_goes_on(
        client: TestClient[Any]) -> None:
    chunk = voiced(0.25).astype("<f4").tobytes()  # 16 kB of 16 kHz float32
    with client.websocket_connect("/v1/audio/live", headers={"x-api-key": KEYS[0]}) as socket:
        assert socket.receive_json()["type"] == "session.created"
        socket.send_bytes(chunk)
        socket.send_bytes(b"\0" * 200_000)
        event = socket.receive_json()
        assert event["type"] == "error" and event["code"] == "message_too_large"
        # the Realtime error shape as well: a Realtime client reads `error`
        assert event["error"]["code"] == "message_too_large" and event["event_id"].startswith("event_")
        socket.send_bytes(chunk)
        socket.send_text('{"type": "finish"}')
        while (done := socket.receive_json(timeout=120))["type"] != "transcript.done":
            assert done["type"] == "transcript.partial", done
    assert done["received_seconds"] == pytest.approx(0.5)  # the audio on both sides of the dropped message


def test_an_append_over_the_limit_is_a_realtime_error_and_the_buffer_stays(client: TestClient[Any]) -> None:
    audio = base64.b64encode((voiced(0.5) * 32767).astype("<i2").tobytes()).decode()  # 16 kB of base64
    with client.websocket_connect("/v1/realtime?intent=transcription", headers={"x-api-key": KEYS[0]}) as socket:
        assert socket.receive_json()["type"] == "session.created"
        socket.send_text(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}}}}))
        assert socket.receive_json()["type"] == "session.updated"
        socket.send_text(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
        socket.send_text(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 200_000}))
        error = socket.receive_json()
        assert error["type"] == "error" and error["error"]["code"] == "message_too_large", error
        socket.send_text(json.dumps({"type": "input_audio_buffer.commit", "event_id": "c1"}))
        committed = socket.receive_json(timeout=120)
        assert committed["type"] == "input_audio_buffer.committed" and committed["client_event_id"] == "c1"


_FIELD_NAMES = st.sampled_from(["file", "model", "language", "prompt", "response_format", "temperature", "stream",
                                "timestamp_granularities[]", "task", "vad", "x"])
_TYPES = st.sampled_from(["audio/wav", "audio/pcm", "audio/pcm;rate=48000;encoding=s16le", "audio/pcm;rate=3",
                          "audio/pcm;encoding=u8", "application/octet-stream", "text/plain", "audio/l16;channels=9"])


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(parts=st.lists(st.tuples(_FIELD_NAMES, st.binary(max_size=600), st.booleans(), _TYPES), max_size=5))
def test_fuzzed_multipart_uploads_get_4xx_only(client: TestClient[Any], parts: list[tuple[str, bytes, bool, str]]) -> None:
    files = [(name, ("f.bin", body, kind) if as_file else (None, body)) for name, body, as_file, kind in parts]
    answer = client.post("/v1/audio/transcriptions", files=files)  # type: ignore[arg-type]
    assert answer.status_code < 500, answer.text
    if answer.status_code >= 400:
        assert isinstance(answer.json()["error"]["code"], str)


def test_transcribed_audio_is_counted_in_the_metrics(client: TestClient[Any]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    assert _upload(client, wav_bytes(voiced(2.0)), "audio/wav").status_code == 200
    samples = {s.name: s.value for f in text_string_to_metric_families(client.get("/metrics").text) for s in f.samples}
    assert samples["tandem_whisper_audio_seconds_total"] >= 2.0
    assert samples["tandem_whisper_real_time_factor_count"] >= 1
    steps = {s.labels["kind"]: s.value for f in text_string_to_metric_families(client.get("/metrics").text)
             for s in f.samples if s.name == "tandem_whisper_step_seconds_total"}
    assert steps.keys() == {"encode", "decode"} and all(v > 0 for v in steps.values())


def test_session_ids_are_unguessable(client: TestClient[Any]) -> None:
    ids = [client.post("/v1/audio/sessions", json={}).json()["id"] for _ in range(2)]
    assert ids[0] != ids[1]
    for sid in ids:
        token = sid.removeprefix("sess_")
        assert len(token) >= 24 and token.replace("-", "").replace("_", "").isalnum()  # 144 random bits
        client.delete(f"/v1/audio/sessions/{sid}")
