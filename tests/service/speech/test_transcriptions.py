"""service/speech/transcriptions.py: a verbose_json answer shaped as OpenAI's (words without Whisper's leading space,
segments only when asked for), over a tiny random Whisper whose transcript is replaced by a known one."""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import numpy as np
import pytest
from litestar.testing import TestClient

from audio.speech import SpeechService
from audio.transcript import Segment, TranscribeOptions, Transcript, Word
from service.app import create_app
from service.speech.setup import SpeechConfig, install_speech
from service.state import AppState
from tests.fixtures.tiny_whisper import build_tiny_whisper
from tests.service.conftest import sse_events
from tests.service.speech.test_routes import assert_error, transcribe, voiced, wav_bytes

SPOKEN = Transcript(" And Mr. Dashwood", "en", 2.0, segments=[Segment(
    0, 0, 0.0, 1.5, " And Mr. Dashwood", words=[Word(" And", 0.0, 0.4, 0.9), Word(" Mr.", 0.4, 0.8, 0.9),
                                                 Word(" Dashwood", 0.8, 1.5, 0.9)])])


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient[Any]]:
    whisper_dir: Path = build_tiny_whisper(tmp_path_factory.mktemp("tiny_whisper"))
    state = install_speech(AppState(), SpeechConfig(model=str(whisper_dir), resident=True))
    with TestClient(create_app(state)) as c:
        yield c


@pytest.fixture
def spoken(monkeypatch: pytest.MonkeyPatch) -> None:
    async def transcribe(self: SpeechService, pcm: np.ndarray, options: TranscribeOptions) -> Transcript:
        return SPOKEN  # as Whisper writes it: each word after a space

    monkeypatch.setattr(SpeechService, "transcribe", transcribe)


def _verbose(client: TestClient[Any], fields: list[tuple[str, str]]) -> dict[str, Any]:
    data: dict[str, Any] = {"model": "whisper-1", "response_format": "verbose_json"}
    for name, value in fields:  # a repeated name is sent as repeated parts
        data[name] = [*data.get(name, []), value]
    r = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav_bytes(voiced(2)), "audio/wav")},
                    data=data)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_words_have_no_leading_space(client: TestClient[Any], spoken: None) -> None:
    body = _verbose(client, [("timestamp_granularities[]", "word")])
    assert [w["word"] for w in body["words"]] == ["And", "Mr.", "Dashwood"]
    assert body["text"] == "And Mr. Dashwood"


@pytest.mark.parametrize("fields, keys", [
    ([], {"segments"}),  # no granularity: segments, as OpenAI's default
    ([("timestamp_granularities[]", "segment")], {"segments"}),
    ([("timestamp_granularities[]", "word")], {"words"}),  # words alone: no segments
    ([("timestamp_granularities", "word")], {"words"}),  # the field's own name
    ([("timestamp_granularities[]", "word"), ("timestamp_granularities[]", "segment")], {"segments", "words"}),
])
def test_segments_and_words_come_as_asked(client: TestClient[Any], spoken: None,
                                          fields: list[tuple[str, str]], keys: set[str]) -> None:
    body = _verbose(client, fields)
    assert {"segments", "words"} & set(body) == keys
    if "segments" in keys:
        assert body["segments"][0]["text"] == " And Mr. Dashwood"  # OpenAI's segments keep Whisper's space


@pytest.mark.parametrize("fmt", ["json", "text", "srt", "vtt", "verbose_json"])
def test_segment_granularity_is_taken_with_any_format(client: TestClient[Any], spoken: None, fmt: str) -> None:
    # The AI SDK's transcribe always sends `segment` (OpenAI's default) beside json; OpenAI takes it with any format.
    def post(*granularity: str) -> Any:
        data = {"model": "whisper-1", "response_format": fmt, "temperature": "0", "language": "en",
                **({"timestamp_granularities[]": list(granularity)} if granularity else {})}
        return client.post("/v1/audio/transcriptions", data=data,
                           files={"file": ("a.wav", wav_bytes(voiced(2)), "audio/wav")})

    asked, plain = post("segment"), post()
    assert asked.status_code == 200, asked.text
    assert asked.text == plain.text and "Dashwood" in asked.text  # nothing beyond the default


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_a_streamed_transcription_takes_segment_granularity(client: TestClient[Any], fmt: str) -> None:
    r = transcribe(client, stream="true", response_format=fmt, **{"timestamp_granularities[]": "segment"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    assert sse_events(r.text)[-1]["type"] == "transcript.text.done"


@pytest.mark.parametrize("fmt, stream", [("json", "false"), ("text", "false"), ("srt", "false"), ("json", "true")])
def test_word_granularity_outside_verbose_json_is_still_refused(client: TestClient[Any], fmt: str,
                                                                  stream: str) -> None:
    r = transcribe(client, response_format=fmt, stream=stream,
                   **{"timestamp_granularities[]": ["segment", "word"]})
    err = assert_error(r, 400, "invalid_value")
    assert err["param"] == "timestamp_granularities[]"
    assert err["message"].endswith(f"word timestamps are chosen only with response_format verbose_json, not {fmt}")


def test_a_json_body_is_told_the_route_takes_a_form(client: TestClient[Any]) -> None:
    # Open WebUI's JSON upload mode: the audio base64 inside JSON.
    r = client.post("/v1/audio/transcriptions", json={"model": "whisper-1",
                                                      "input_audio": {"data": "UklGRg==", "format": "wav"}})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("invalid_content_type", "file")
    assert "multipart/form-data" in err["message"] and "application/json" in err["message"]


@pytest.mark.parametrize("headers, said", [
    ({"content-type": "multipart/form-data"}, "names no boundary"),  # a page that set the header on FormData itself
    ({"content-type": "multipart/form-data; boundary="}, "names no boundary"),
    ({}, "a body without a Content-Type"),
])
def test_a_form_without_a_boundary_or_a_type_is_told_so(client: TestClient[Any], headers: dict[str, str],
                                                          said: str) -> None:
    r = client.post("/v1/audio/transcriptions", content=b"abc", headers=headers)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("invalid_content_type", "file") and said in err["message"]


def test_an_undecodable_upload_is_told_in_plain_words(client: TestClient[Any]) -> None:
    r = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", b"not audio at all" * 40, "audio/wav")},
                    data={"model": "whisper-1"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("unsupported_or_corrupt_audio", "file")
    assert err["message"].startswith("could not decode the audio file")
    assert "Errno" not in err["message"] and "<none>" not in err["message"]
    assert "audio/pcm, " in err["message"] and "audio/x-mulaw" in err["message"]  # the types read as raw samples


@pytest.fixture
def heard(monkeypatch: pytest.MonkeyPatch) -> list[Transcript]:
    """What the (patched) service transcribes: the list's one Transcript, as a whole and as a stream."""
    said = [SPOKEN]

    async def transcribe(self: SpeechService, pcm: np.ndarray, options: TranscribeOptions) -> Transcript:
        return said[0]

    async def transcribe_stream(self: SpeechService, pcm: np.ndarray,
                                options: TranscribeOptions) -> AsyncIterator[list[Segment] | Transcript]:
        yield list(said[0].segments)
        yield said[0]

    monkeypatch.setattr(SpeechService, "transcribe", transcribe)
    monkeypatch.setattr(SpeechService, "transcribe_stream", transcribe_stream)
    return said


def _answer(client: TestClient[Any], model: str, **fields: str) -> dict[str, Any]:
    r = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav_bytes(voiced(2)), "audio/wav")},
                    data={"model": model, **fields})
    assert r.status_code == 200, r.text
    if fields.get("stream") != "true":
        return r.json()  # type: ignore[no-any-return]
    done: dict[str, Any] = sse_events(r.text)[-1]
    assert done["type"] == "transcript.text.done", done
    return done


@pytest.mark.parametrize("stream", ["false", "true"])
def test_gpt_transcribe_answers_name_the_language_heard(client: TestClient[Any], heard: list[Transcript],
                                                        stream: str) -> None:
    # openai-python's Transcription.languages and TranscriptionTextDoneEvent.languages, "Returned by gpt-transcribe":
    # LiveKit's stt.py reads resp.languages[0].code
    assert _answer(client, "gpt-transcribe", stream=stream)["languages"] == [{"code": "en"}]
    heard[0] = Transcript(" Sugeng enjing", "jw", 1.0, segments=[Segment(0, 0, 0.0, 1.0, " Sugeng enjing")])
    assert _answer(client, "gpt-transcribe", stream=stream)["languages"] == [{"code": "jv"}]  # ISO 639-1
    heard[0] = Transcript("", "en", 1.0)
    assert _answer(client, "gpt-transcribe", stream=stream)["languages"] == []  # nothing heard, no language


@pytest.mark.parametrize("model, fields", [("whisper-1", {}), ("gpt-4o-transcribe", {"stream": "true"}),
                                           ("gpt-transcribe", {"response_format": "verbose_json"})])
def test_other_answers_keep_openais_shape(client: TestClient[Any], heard: list[Transcript], model: str,
                                          fields: dict[str, str]) -> None:
    # OpenAI's verbose_json has no `languages` (its `language` names it), and other models' answers none
    assert "languages" not in _answer(client, model, **fields)


def test_a_translation_names_no_languages(client: TestClient[Any], heard: list[Transcript]) -> None:
    r = client.post("/v1/audio/translations", files={"file": ("a.wav", wav_bytes(voiced(2)), "audio/wav")},
                    data={"model": "gpt-transcribe"})
    assert r.status_code == 200 and "languages" not in r.json(), r.text  # OpenAI's Translation has none
