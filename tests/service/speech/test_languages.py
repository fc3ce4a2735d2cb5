"""A language the served Whisper has no token for (Cantonese, `yue`, came with large-v3; small/base/medium/large-v2
have 99 languages) is a 400 naming `language` on every speech route, and a Realtime error event naming the
session's transcription language while the session goes on; before, decoding failed mid-request (a 500, an SSE
error without [DONE], a socket closed 1011). OpenAI's `languages` (those the speech may be in: the file form's
`languages[]`, a Realtime session's `transcription.languages`) has Whisper detect the language among them only."""

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


def _unrestricted(client: TestClient[Any]) -> str:
    r = _post(client, response_format="verbose_json")
    assert r.status_code == 200, r.text
    return str(r.json()["language"])


def test_a_file_in_one_of_several_languages_is_detected_among_them(client: TestClient[Any]) -> None:
    # wyoming-openai's `--languages en fr`: languages[]=en&languages[]=fr (before: a 400, "at most one language")
    from mlx_whisper.tokenizer import LANGUAGES

    anywhere = _unrestricted(client)  # verbose_json's language: Whisper's name ("english")
    among = [c for c in ("de", "fr", "ja", "sw") if LANGUAGES[c] != anywhere][:2]
    for fields in ({"languages[]": among}, {"languages[]": [LANGUAGES[among[0]].title(), among[1], among[1]]},
                   {f"languages[{i}]": code for i, code in enumerate(among)}):
        r = _post(client, response_format="verbose_json", **fields)
        assert r.status_code == 200, r.text
        assert r.json()["language"] in {LANGUAGES[c] for c in among}, (fields, r.json()["language"])
    # one left (duplicates collapse) is exactly `language`, as is `language` among them
    for fields in ({"languages[]": [among[0], LANGUAGES[among[0]]]}, {"language": among[1], "languages[]": among}):
        r = _post(client, response_format="verbose_json", **fields)
        assert r.status_code == 200 and r.json()["language"] == LANGUAGES[fields.get("language", among[0])], r.text


@pytest.mark.parametrize("fields, param", [
    ({"language": "de", "languages[]": ["en", "fr"]}, "languages[]"),
    ({"languages[]": ["en", "klingon"]}, "languages[1]"),
    ({"languages[0]": "en", "languages[1]": "Cantonese"}, "languages[1]"),
    ({"languages[]": ["", "en"], "stream": "true"}, "languages[0]"),
])
def test_languages_that_cannot_be_honoured_are_refused_naming_them(client: TestClient[Any], fields: dict[str, Any],
                                                                   param: str) -> None:
    err = assert_error(_post(client, **fields), 400, "invalid_value")
    assert err["param"] == param, err


def _languages_update(languages: list[str], language: str | None = None, model: str = "whisper-1") -> str:
    transcription: dict[str, Any] = {"model": model, "languages": languages}
    if language is not None:
        transcription["language"] = language
    return json.dumps({"type": "session.update", "event_id": "evt_2", "session": {"type": "transcription", "audio": {
        "input": {"turn_detection": None, "transcription": transcription}}}})


def test_a_realtime_session_detects_each_item_among_its_languages(client: TestClient[Any],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from audio.scheduler import WhisperScheduler
    from tests.service.speech.test_live_socket import append, until
    from tests.service.speech.test_live_socket import voiced as voiced_24k

    decoded: list[tuple[tuple[str, ...], str]] = []
    decode = WhisperScheduler.decode

    async def spy(self: WhisperScheduler, loaded: Any, request: Any, *rest: Any) -> Any:
        result = await decode(self, loaded, request, *rest)
        decoded.append((request.languages, result.language))
        return result

    monkeypatch.setattr(WhisperScheduler, "decode", spy)
    with client.websocket_connect("/v1/realtime?intent=transcription") as ws:
        assert ws.receive_json(timeout=30)["type"] == "session.created"
        for among in (["de", "fr"], ["ja", "sw"]):  # an update detects anew, among its own
            ws.send_text(_languages_update(among, model="gpt-live-transcribe"))
            shown = until(ws, "session.updated")[-1]["session"]["audio"]["input"]["transcription"]
            assert shown["languages"] == among and shown["language"] is None
            append(ws, voiced_24k(1.0))
            ws.send_text(json.dumps({"type": "input_audio_buffer.commit"}))
            events = until(ws, "conversation.item.input_audio_transcription.completed")
            assert not [e for e in events if e["type"] == "error"], events
            assert decoded and all(given == tuple(among) and code in among for given, code in decoded), decoded
            # gpt-live-transcribe's completed names the one detected (OpenAI's `languages`, LiveKit reads it)
            assert events[-1]["transcript"] and events[-1]["languages"] == [{"code": decoded[-1][1]}], events[-1]
            decoded.clear()


@pytest.mark.parametrize("languages, language, param", [
    (["en", "klingon"], None, "session.audio.input.transcription.languages[1]"),
    (["en", "fr"], "de", "session.audio.input.transcription.languages"),
])
def test_realtime_languages_that_cannot_be_honoured_are_named_where_they_sit(
        client: TestClient[Any], languages: list[str], language: str | None, param: str) -> None:
    with client.websocket_connect("/v1/realtime?intent=transcription") as ws:
        assert ws.receive_json(timeout=30)["type"] == "session.created"
        ws.send_text(_languages_update(languages, language))
        event = ws.receive_json(timeout=30)
        assert event["type"] == "error" and event["error"]["param"] == param, event
    session = {"type": "transcription", "audio": {"input": {"transcription": {"languages": languages,
                                                                             "language": language}}}}
    err = assert_error(client.post("/v1/realtime/client_secrets", json={"session": session}), 400, "invalid_value")
    assert err["param"] == param, err
