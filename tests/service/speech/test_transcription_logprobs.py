"""POST /v1/audio/transcriptions with `include[]=logprobs` (as the OpenAI SDK sends `include=["logprobs"]`): the JSON
answer and the streamed events carry the log probabilities of their text's tokens, whose bytes join to exactly that
text; asked for with another response_format it is a 400 naming include[], as OpenAI's; not asked, nothing is kept."""

from __future__ import annotations

from typing import Any, AsyncGenerator

import numpy as np
import pytest
from litestar.testing import TestClient

from audio.speech import SpeechService
from audio.token_logprobs import TokenLogprob
from audio.transcript import Segment, TranscribeOptions, Transcript
from tests.service.conftest import sse_events
from tests.service.speech.test_routes import assert_error, transcribe, voiced, wav_bytes
from tests.service.speech.test_transcriptions import client  # noqa: F401 (the Whisper app, a fixture)

LOGPROBS = {"include[]": "logprobs"}


def entry(raw: bytes, logprob: float) -> TokenLogprob:
    return TokenLogprob(raw.decode(), logprob, tuple(raw))


# Two windows' segments as Whisper writes them (a leading space, a trailing one on the last) with their tokens'
FIRST = Segment(0, 0, 0.0, 1.0, " And Mr.", logprobs=(entry(b" And", -0.1), entry(b" Mr.", -0.2)))
SECOND = Segment(1, 100, 1.0, 2.0, " Dashwood ", logprobs=(entry(b" Dash", -0.3), entry(b"wood ", -0.4)))


def joined(entries: list[dict[str, Any]], errors: str = "strict") -> str:
    return bytes(b for e in entries for b in e["bytes"]).decode(errors=errors)


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[TranscribeOptions]:
    """The speech service writes FIRST and SECOND (their log probabilities where the options ask); the options each
    transcription was asked with."""
    seen: list[TranscribeOptions] = []

    def written(options: TranscribeOptions) -> list[Segment]:
        return [s if options.logprobs else Segment(s.id, s.seek, s.start, s.end, s.text) for s in (FIRST, SECOND)]

    async def stream(self: SpeechService, pcm: np.ndarray,
                     options: TranscribeOptions) -> AsyncGenerator[list[Segment] | Transcript, None]:
        seen.append(options)
        segments = written(options)
        for s in segments:
            yield [s]
        yield Transcript("".join(s.text for s in segments), "en", 2.0, segments=segments,
                         logprobs=tuple(e for s in segments for e in s.logprobs or ()) if options.logprobs else None)

    monkeypatch.setattr(SpeechService, "transcribe_stream", stream)
    return seen


@pytest.mark.parametrize("model", ["whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe"])
def test_the_json_answer_carries_its_texts_token_log_probabilities(client: TestClient[Any], model: str) -> None:
    # the tiny random Whisper itself, under each id that names it; sampled, its text may hold a token that is no whole
    # character, which the text shows as U+FFFD (as Whisper's decode does) and the bytes as they are
    r = transcribe(client, model=model, **LOGPROBS)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"text", "usage", "logprobs"}
    assert all(set(e) == {"token", "logprob", "bytes"} and e["logprob"] <= 0 for e in body["logprobs"])
    assert joined(body["logprobs"], "replace") == body["text"] and bool(body["logprobs"]) == bool(body["text"])
    assert set(transcribe(client, model=model).json()) == {"text", "usage"}  # not asked: not given


def test_the_streamed_events_carry_their_own_texts(client: TestClient[Any]) -> None:
    # greedy: whole characters (sampled, a window could end inside one, which its delta's text shows as U+FFFD)
    events = sse_events(transcribe(client, stream="true", temperature="0", **LOGPROBS).text)
    *deltas, done = events
    assert done["type"] == "transcript.text.done" and all(e["type"] == "transcript.text.delta" for e in deltas)
    for e in deltas:
        assert joined(e["logprobs"]) == e["delta"] and all(x["logprob"] <= 0 for x in e["logprobs"])
    assert joined(done["logprobs"]) == done["text"]
    assert all("logprobs" not in e for e in sse_events(transcribe(client, stream="true").text))  # not asked


def test_the_answers_text_and_its_tokens_lose_the_same_spaces(client: TestClient[Any],
                                                              asked: list[TranscribeOptions]) -> None:
    body = transcribe(client, **LOGPROBS).json()
    assert body["text"] == "And Mr. Dashwood"
    assert body["logprobs"] == [{"token": "And", "logprob": -0.1, "bytes": list(b"And")},
                                {"token": " Mr.", "logprob": -0.2, "bytes": list(b" Mr.")},
                                {"token": " Dash", "logprob": -0.3, "bytes": list(b" Dash")},
                                {"token": "wood", "logprob": -0.4, "bytes": list(b"wood")}]
    first, second, done = sse_events(transcribe(client, stream="true", **LOGPROBS).text)
    assert (first["delta"], joined(first["logprobs"])) == ("And Mr.", "And Mr.")  # the first delta's space too
    assert [e["logprob"] for e in first["logprobs"]] == [-0.1, -0.2]
    assert second["logprobs"] == [e.as_dict() for e in SECOND.logprobs or ()]
    assert done["logprobs"] == body["logprobs"]
    assert [o.logprobs for o in asked] == [True, True]


def test_not_asked_nothing_is_kept(client: TestClient[Any], asked: list[TranscribeOptions]) -> None:
    assert set(transcribe(client).json()) == {"text", "usage"}
    assert all("logprobs" not in e for e in sse_events(transcribe(client, stream="true").text))
    assert [o.logprobs for o in asked] == [False, False]  # no decode keeps them


@pytest.mark.parametrize("fields", [
    {"response_format": "text"}, {"response_format": "verbose_json"}, {"response_format": "srt"},
    {"response_format": "vtt"}, {"response_format": "text", "stream": "true"},
])
def test_logprobs_come_with_response_format_json_only(client: TestClient[Any], fields: dict[str, str]) -> None:
    err = assert_error(transcribe(client, **fields, **LOGPROBS), 400, "invalid_value")
    assert err["param"] == "include[]" and f"json only, not {fields['response_format']}" in err["message"]


@pytest.mark.parametrize("include", [["logprobs", "segments"], "", "Logprobs"])
def test_an_include_value_other_than_logprobs_is_refused_by_name(client: TestClient[Any], include: Any) -> None:
    err = assert_error(transcribe(client, **{"include[]": include}), 400, "invalid_value")
    assert err["param"] == "include[]" and "logprobs is the one include value" in err["message"]


def test_a_translation_takes_no_include(client: TestClient[Any]) -> None:
    # OpenAI's translations have no `include`: English text only
    r = client.post("/v1/audio/translations", files={"file": ("a.wav", wav_bytes(voiced(2)), "audio/wav")},
                    data={"model": "whisper-1", "temperature": "1.0", **LOGPROBS})
    assert assert_error(r, 400)["param"] == "include[]"
