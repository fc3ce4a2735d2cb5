"""POST /v1/audio/translations over tiny random-init Whispers: OpenAI's fields run Whisper's translate task on a
multilingual model; an English-only model is refused as a transcription's task=translate is, naming `model`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.speech.setup import SpeechConfig, install_speech
from service.state import AppState
from tests.fixtures.tiny_whisper import TINY_WHISPER_DIMS, build_tiny_whisper
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


def test_an_english_only_model_is_refused_naming_the_model(english: TestClient[Any]) -> None:
    refused = assert_error(_post(english, "translations"), 400, "invalid_value")
    as_transcription = assert_error(_post(english, "transcriptions", task="translate"), 400, "invalid_value")
    assert refused["param"] == "model" and refused["message"] == as_transcription["message"]


@pytest.mark.parametrize("field, value", [("language", "de"), ("stream", "true"),
                                          ("timestamp_granularities[]", "word")])
def test_a_field_translations_do_not_have_is_refused_by_name(multilingual: TestClient[Any], field: str,
                                                             value: str) -> None:
    err = assert_error(_post(multilingual, "translations", **{field: value}), 400, "unknown_parameter")
    assert err["param"] == field
