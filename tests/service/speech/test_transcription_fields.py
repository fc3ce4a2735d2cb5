"""The transcription form's field names beyond OpenAI's: bracketed names (an unknown one is named as sent; `name[0]`
entries of an array field are its entries) and speaches' aliases (`vad_filter`, `hotwords`, `without_timestamps`)."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import TestClient

from tests.service.speech.test_routes import assert_error, transcribe
from tests.service.speech.test_transcriptions import client  # noqa: F401 (the Whisper app, a fixture)


def _asked(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What the route asks the speech service for (its transcribe_options keywords), one dict a request."""
    import service.speech.transcriptions as routes

    asked: list[dict[str, Any]] = []
    real = routes.transcribe_options
    monkeypatch.setattr(routes, "transcribe_options", lambda *a, **kw: asked.append(kw) or real(*a, **kw))
    return asked


@pytest.mark.parametrize("field", ["stream_options[include_usage]", "foo[bar]", "known_speaker_references[0]"])
def test_an_unknown_bracketed_field_is_named_as_any_unknown_field(client: TestClient[Any], field: str) -> None:
    # it was "Extra inputs are not permitted" with param null: the bracket read as a pydantic tag
    err = assert_error(transcribe(client, **{field: "1"}), 400, "unknown_parameter")
    assert err["param"] == field and err["message"] == f"Unrecognized request argument supplied: {field}"
    both = assert_error(transcribe(client, **{field: "1", "some_future_field": "1"}), 400, "unknown_parameter")
    assert field in both["message"] and "some_future_field" in both["message"]


def test_indexed_entries_are_the_arrays_entries(client: TestClient[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """qs and axios send `name[0]`, `name[1]` … for an array, as the SDK sends `name[]`."""
    asked = _asked(monkeypatch)
    indexed = {"keywords[1]": "Elinor", "keywords[0]": "Marianne", "timestamp_granularities[0]": "word",
               "timestamp_granularities[1]": "segment", "languages[0]": "en"}
    r = transcribe(client, response_format="verbose_json", **indexed)
    assert r.status_code == 200, r.text
    assert "words" in r.json() and "segments" in r.json()
    assert asked[0]["prompt"] == "Marianne, Elinor" and asked[0]["languages"] == ["en"] and asked[0]["word_timestamps"]
    err = assert_error(transcribe(client, **{"timestamp_granularities[0]": "sentence"}), 400, "invalid_value")
    assert err["param"] == "timestamp_granularities[]"  # checked as the SDK's form is, named as it names the field
    err = assert_error(transcribe(client, **{"languages[0]": "en", "languages[1]": "de"}), 400, "invalid_value")
    assert err["param"] == "languages[1]"  # English-only: the entry at fault, by its index


def test_a_bracketed_key_of_an_object_field_is_still_its_key(client: TestClient[Any],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _asked(monkeypatch)
    r = transcribe(client, **{"chunking_strategy[type]": "server_vad", "chunking_strategy[threshold]": "0.9"})
    assert r.status_code == 200, r.text
    assert asked[0]["vad"] is True and asked[0]["vad_aggressiveness"] == 3


def test_speaches_fields_are_this_servers(client: TestClient[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """wyoming-openai's speaches backend sends vad_filter=false with every Home Assistant utterance."""
    asked = _asked(monkeypatch)
    for fields in ({"vad_filter": "false"}, {"vad_filter": "true"}, {"vad_filter": "false", "vad": "false"},
                   {"hotwords": "Marianne, Elinor Dashwood ,"}, {"without_timestamps": "true"}, {}):
        assert transcribe(client, prompt="Norland", **fields).status_code == 200, fields
    assert [a["vad"] for a in asked] == [False, True, False, None, None, None]  # None: the server's default
    assert asked[3]["prompt"] == "Norland Marianne, Elinor Dashwood"  # as keywords[] Marianne, Elinor Dashwood
    assert [a["without_timestamps"] for a in asked] == [False] * 4 + [True, False]


def test_hotwords_are_split_at_commas_keeping_phrases() -> None:
    from service.speech.transcription_fields import hotword_list

    assert hotword_list(" Marianne,Elinor Dashwood, ,") == ["Marianne", "Elinor Dashwood"]
    assert hotword_list("Marianne Elinor") == ["Marianne Elinor"]  # faster-whisper's prompt text, unchanged
    assert hotword_list(None) == hotword_list("") == []


@pytest.mark.parametrize("fields, param", [
    ({"vad": "true", "vad_filter": "false"}, "vad_filter"),
    ({"vad": "false", "vad_filter": "true"}, "vad_filter"),
    ({"keywords[]": "Marianne", "hotwords": "Elinor"}, "hotwords"),
    ({"vad_filter": "false", "chunking_strategy": "auto"}, "chunking_strategy"),
    ({"vad_filter": "true", "vad_trim": "true"}, "vad_trim"),
])
def test_an_alias_that_contradicts_its_twin_is_refused_by_name(client: TestClient[Any], fields: dict[str, str],
                                                               param: str) -> None:
    err = assert_error(transcribe(client, **fields), 400, "invalid_value")
    assert err["param"] == param, err


def test_an_alias_that_agrees_with_its_twin_is_taken(client: TestClient[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _asked(monkeypatch)
    assert transcribe(client, vad="false", vad_filter="false").status_code == 200
    assert transcribe(client, hotwords="Marianne, Elinor", **{"keywords[]": ["Marianne", "Elinor"]}).status_code == 200
    assert asked[0]["vad"] is False and asked[1]["prompt"] == "Marianne, Elinor"


def test_hotwords_that_make_the_prompt_too_long_are_named(client: TestClient[Any]) -> None:
    err = assert_error(transcribe(client, prompt="p" * 1500, hotwords="w" * 1000), 400)
    assert err["param"] == "hotwords" and "keywords joined" in err["message"]
