"""POST /v1/audio/translations over tiny random-init Whispers: OpenAI's fields run Whisper's translate task on a
multilingual model; on an English-only model a translation is its transcription."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.speech.setup import SpeechConfig, install_speech
from service.state import AppState
from tests.fixtures.tiny_whisper import TINY_WHISPER_DIMS, build_tiny_whisper
from tests.service.conftest import sse_events
from tests.service.speech.test_routes import assert_error, voiced, wav_bytes


def _client(directory: Path) -> Iterator[TestClient[Any]]:
    state = install_speech(AppState(), SpeechConfig(model=str(directory), resident=True))
    with TestClient(create_app(state)) as c:
        yield c


@pytest.fixture(scope="module")
def english(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient[Any]]:
    yield from _client(build_tiny_whisper(tmp_path_factory.mktemp("tiny_en")))


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient[Any]]:
    yield from _client(build_tiny_whisper(tmp_path_factory.mktemp("tiny"), {**TINY_WHISPER_DIMS, "n_vocab": 51865}))


def _post(client: TestClient[Any], route: str, **fields: str) -> Any:
    return client.post(f"/v1/audio/{route}", files={"file": ("a.wav", wav_bytes(voiced(1.5)), "audio/wav")},
                       data={"model": "whisper-1", "temperature": "1.0", **fields})


def test_a_multilingual_model_translates(multilingual: TestClient[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import service.speech.transcriptions as routes

    asked: list[str] = []
    real = routes.transcribe_options
    monkeypatch.setattr(routes, "transcribe_options", lambda *a, **kw: asked.append(kw["task"]) or real(*a, **kw))
    r = _post(multilingual, "translations", response_format="verbose_json", prompt="Dashwood")
    assert r.status_code == 200, r.text
    assert r.json()["task"] == "translate" and r.json()["duration"] == pytest.approx(1.5) and asked == ["translate"]
    assert r.json()["language"] == "english"  # OpenAI: always english, the output's (whatever was detected)
    text = _post(multilingual, "translations", response_format="text")
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain")


def test_a_file_part_without_a_filename_is_translated(multilingual: TestClient[Any]) -> None:
    r = multilingual.post("/v1/audio/translations", files={"file": (None, wav_bytes(voiced(1.5)), "audio/wav")},
                          data={"temperature": "1.0", "response_format": "verbose_json"})
    assert r.status_code == 200, r.text
    assert r.json()["duration"] == pytest.approx(1.5)


@pytest.mark.parametrize("response_format", ["verbose_json", "json", "text", "srt", "vtt"])
def test_an_english_only_model_translates_as_it_transcribes(english: TestClient[Any], response_format: str) -> None:
    """Subtitle tools call /translations whatever the model: tiny.en's was a 400 naming `model`. Its one language
    is English: faster-whisper and openai-whisper run its translate as the transcription."""
    fields = {"temperature": "0", "response_format": response_format}
    translated, transcribed = _post(english, "translations", **fields), _post(english, "transcriptions", **fields)
    assert translated.status_code == transcribed.status_code == 200, translated.text
    assert translated.headers["content-type"] == transcribed.headers["content-type"]
    if response_format.endswith("json"):
        body, spoken = translated.json(), transcribed.json()
        assert body["text"] == spoken["text"] and body.get("segments") == spoken.get("segments")
        if response_format == "verbose_json":
            assert body["task"] == "translate" and body["language"] == "english"  # as any translation's answer
    else:
        assert translated.text == transcribed.text


@pytest.mark.parametrize("field, value", [("timestamp_granularities[]", "word"), ("vad_filter", "false")])
def test_a_field_translations_do_not_have_is_refused_by_name(multilingual: TestClient[Any], field: str,
                                                             value: str) -> None:
    err = assert_error(_post(multilingual, "translations", **{field: value}), 400, "unknown_parameter")
    assert err["param"] == field


def test_language_names_the_speech_translated(multilingual: TestClient[Any], english: TestClient[Any],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's TranslationRequest takes `language`, the source audio's: the decoder's language, as in a
    transcription. An English-only model has one language: another is refused by name."""
    import service.speech.transcriptions as routes

    asked: list[tuple[str, str | None]] = []
    real = routes.transcribe_options
    monkeypatch.setattr(routes, "transcribe_options",
                        lambda *a, **kw: asked.append((kw["task"], kw["language"])) or real(*a, **kw))
    r = _post(multilingual, "translations", language="German", response_format="verbose_json")
    assert r.status_code == 200, r.text
    assert r.json()["language"] == "english" and asked == [("translate", "German")]
    assert _post(english, "translations", language="en").status_code == 200
    err = assert_error(_post(english, "translations", language="de"), 400, "invalid_value")
    assert err["param"] == "language" and "English-only" in err["message"]


@pytest.mark.parametrize("model", ["english", "multilingual"])
def test_a_translation_streams_as_a_transcription_does(model: str, request: pytest.FixtureRequest) -> None:
    """vLLM's TranslationRequest takes `stream`: the transcription route's SSE events (OpenAI streams no
    translations; vLLM's chat-style chunks are not what this server's transcriptions send either)."""
    client: TestClient[Any] = request.getfixturevalue(model)
    r = _post(client, "translations", stream="true", response_format="text", temperature="0")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    events = sse_events(r.text)
    assert events[-1]["type"] == "transcript.text.done" and events[-1]["usage"]["type"] == "tokens"
    assert 0 < events[-1]["usage"]["input_token_details"]["audio_tokens"] <= 1.5 * 50  # the speech VAD kept
    assert all(e["type"] == "transcript.text.delta" for e in events[:-1])
    assert "".join(e["delta"] for e in events[:-1]) == events[-1]["text"]
    answered = _post(client, "translations", temperature="0").json()["text"]
    assert events[-1]["text"] == answered  # the translation, streamed
    err = assert_error(_post(client, "translations", stream="true", response_format="srt"), 400, "invalid_value")
    assert err["param"] == "stream"
