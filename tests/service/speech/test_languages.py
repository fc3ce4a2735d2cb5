"""A language the served Whisper has no token for (Cantonese, `yue`, came with large-v3; small/base/medium/large-v2
have 99 languages) is a 400 naming `language` on every speech route, and a Realtime error event naming the
session's transcription language while the session goes on; before, decoding failed mid-request (a 500, an SSE
error without [DONE], a socket closed 1011)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.speech.setup import SpeechConfig, install_speech
from service.state import AppState
from tests.fixtures.tiny_whisper import TINY_WHISPER_DIMS, build_tiny_whisper
from tests.service.speech.test_routes import assert_error, voiced, wav_bytes


@pytest.fixture(scope="module")
def whisper_99(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_whisper(tmp_path_factory.mktemp("ml-v2"), {**TINY_WHISPER_DIMS, "n_vocab": 51865})


@pytest.fixture(scope="module")
def client(whisper_99: Path) -> Iterator[TestClient[Any]]:
    state = install_speech(AppState(), SpeechConfig(model=str(whisper_99), resident=True))
    with TestClient(create_app(state)) as c:
        yield c


def _post(client: TestClient[Any], **fields: str) -> Any:
    return client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav_bytes(voiced(1.0)), "audio/wav")},
                       data={"model": "whisper-1", **fields})


@pytest.mark.parametrize("fields", [{"language": "yue"}, {"language": "Cantonese", "stream": "true"}])
def test_a_file_in_a_language_the_model_lacks_is_a_400_naming_language(client: TestClient[Any],
                                                                       fields: dict[str, str]) -> None:
    err = assert_error(_post(client, **fields), 400, "invalid_value")
    assert err["param"] == "language" and "cantonese" in err["message"]


def test_javanese_by_its_iso_code_is_taken(client: TestClient[Any]) -> None:
    r = _post(client, language="jv", temperature="1.0", response_format="json")
    assert r.status_code == 200, r.text


def test_a_session_in_a_language_the_model_lacks_is_a_400_naming_language(client: TestClient[Any]) -> None:
    err = assert_error(client.post("/v1/audio/sessions", json={"language": "yue"}), 400, "invalid_value")
    assert err["param"] == "language"


def test_a_realtime_session_update_to_it_is_an_error_event_and_the_session_goes_on(client: TestClient[Any]) -> None:
    with client.websocket_connect("/v1/realtime?intent=transcription") as ws:
        assert ws.receive_json(timeout=30)["type"] == "session.created"
        ws.send_text(json.dumps({"type": "session.update", "event_id": "evt_1", "session": {
            "type": "transcription",
            "audio": {"input": {"transcription": {"model": "whisper-1", "language": "yue"}}}}}))
        event = ws.receive_json(timeout=30)
        assert event["type"] == "error", event
        assert event["error"]["param"] == "session.audio.input.transcription.language"
        assert event["error"]["event_id"] == "evt_1"
        ws.send_text(json.dumps({"type": "session.update", "session": {
            "type": "transcription", "audio": {"input": {"transcription": {"language": "de"}}}}}))
        updated = ws.receive_json(timeout=30)
        assert updated["type"] == "session.updated", updated
        assert updated["session"]["audio"]["input"]["transcription"]["language"] == "de"


def test_a_language_changed_mid_session_decodes_the_next_item_in_it(client: TestClient[Any],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from audio.scheduler import WhisperScheduler
    from tests.service.speech.test_live_socket import append, until
    from tests.service.speech.test_live_socket import voiced as voiced_24k

    languages: list[str | None] = []
    decode = WhisperScheduler.decode
    monkeypatch.setattr(WhisperScheduler, "decode", lambda self, loaded, request, *rest: (
        languages.append(request.language), decode(self, loaded, request, *rest))[1])

    def update(language: str) -> str:
        return json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "turn_detection": None, "transcription": {"model": "whisper-1", "language": language}}}}})

    with client.websocket_connect("/v1/realtime?intent=transcription") as ws:
        assert ws.receive_json(timeout=30)["type"] == "session.created"
        ws.send_text(update("de"))
        until(ws, "session.updated")
        for language in ("de", "fr"):
            append(ws, voiced_24k(1.0))
            ws.send_text(json.dumps({"type": "input_audio_buffer.commit"}))
            events = until(ws, "conversation.item.input_audio_transcription.completed")
            assert not [e for e in events if e["type"] == "error"], events
            assert languages and set(languages) == {language}
            languages.clear()
            ws.send_text(update("fr"))
            assert until(ws, "session.updated")[-1]["session"]["audio"]["input"]["transcription"]["language"] == "fr"
