"""service/audio_routes.py over a tiny random-init Whisper: status codes, shapes, errors, sessions."""

from __future__ import annotations

import dataclasses
import io
import json
import struct
import wave
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.state import STATE_KEY, AppState
from service.speech.setup import SpeechConfig, install_speech
from tests.fixtures.g711 import encode_g711
from tests.fixtures.tiny_whisper import build_tiny_whisper
from tests.service.conftest import sse_events

SR = 16000


def voiced(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return (((t * 150) % 1.0 - 0.5) * 0.5 * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)


def wav_bytes(x: np.ndarray, rate: int = SR) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((x * 32767).astype("<i2").tobytes())
    return buf.getvalue()


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_whisper(tmp_path_factory.mktemp("tiny_whisper"))


@pytest.fixture(scope="module")
def client(whisper_dir: Path) -> Iterator[TestClient[Any]]:
    state = install_speech(AppState(), SpeechConfig(model=str(whisper_dir), resident=True))
    with TestClient(create_app(state)) as c:
        yield c


def transcribe(client: TestClient[Any], audio: bytes = b"", **fields: Any) -> Any:
    data = {"model": "whisper-1", "temperature": "1.0", **fields}  # one rung: keeps the random model quick
    return client.post("/v1/audio/transcriptions", files={"file": ("a.wav", audio or wav_bytes(voiced(2)), "audio/wav")},
                       data=data)


def assert_error(r: Any, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert isinstance(err["code"], str) and err["code"]  # never null, multipart errors included
    if code:
        assert err["code"] == code
    return err


def test_models_lists_the_whisper_model(client: TestClient[Any], whisper_dir: Path) -> None:
    cards = client.get("/v1/models").json()["data"]
    assert [c["id"] for c in cards if c.get("kind") == "transcription"] == [whisper_dir.name]


@pytest.mark.parametrize("model", ["gpt-4o-transcribe", "gpt-4o-mini-transcribe", "gpt-transcribe",
                                   "gpt-realtime-whisper"])
def test_openai_transcription_model_ids_name_the_served_whisper(client: TestClient[Any], model: str) -> None:
    # the defaults of openai-agents, LiveKit and Pipecat: clients that send them work unchanged
    assert transcribe(client, model=model).status_code == 200
    # what OpenAI gives for gpt-4o-transcribe only, Whisper gives too: its tokens' log probabilities
    assert "logprobs" in transcribe(client, model=model, **{"include[]": "logprobs"}).json()


def test_the_diarizing_model_is_not_served_as_whisper(client: TestClient[Any]) -> None:
    assert assert_error(transcribe(client, model="gpt-4o-transcribe-diarize"), 404, "model_not_found")["param"] == \
        "model"


@pytest.mark.parametrize("fmt, check", [
    ("json", lambda r: set(r.json()) == {"text", "usage"} and r.json()["usage"]["type"] == "duration"),
    ("text", lambda r: r.headers["content-type"].startswith("text/plain")),
    ("srt", lambda r: r.text == "" or " --> " in r.text),
    ("vtt", lambda r: r.text.startswith("WEBVTT")),
    ("verbose_json", lambda r: {"task", "language", "duration", "text", "segments"} <= set(r.json())),
])
def test_transcription_formats(client: TestClient[Any], fmt: str, check: Any) -> None:
    r = transcribe(client, response_format=fmt)
    assert r.status_code == 200, r.text
    assert check(r)


def test_verbose_json_with_word_granularity(client: TestClient[Any]) -> None:
    r = transcribe(client, response_format="verbose_json", **{"timestamp_granularities[]": "word"})  # as the SDK sends one
    body = r.json()
    assert r.status_code == 200 and body["duration"] == pytest.approx(2.0) and body["language"] == "english"
    assert isinstance(body["words"], list)


def test_streamed_transcription_ends_with_done(client: TestClient[Any]) -> None:
    r = transcribe(client, stream="true")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1]["type"] == "transcript.text.done"
    assert all(e["type"] == "transcript.text.delta" for e in events[:-1])
    assert "".join(e["delta"] for e in events[:-1]) == events[-1]["text"]
    assert not events[-1]["text"][:1].isspace()  # as OpenAI's: no leading space
    assert events[-1]["usage"]["type"] == "tokens"  # OpenAI's done event takes no duration usage


def test_a_streamed_transcriptions_usage_is_openais_token_usage(client: TestClient[Any]) -> None:
    """openai-python's TranscriptionTextDoneEvent.usage takes `type: "tokens"` only (openai-java's too), and
    async-openai requires it with both input_token_details: the prompt's tokens Whisper read, 50 encoder positions a
    second of the audio decoded (VAD off: all 2 s of it), the text tokens written."""
    from mlx_whisper.tokenizer import get_tokenizer
    from openai.types.audio import TranscriptionTextDoneEvent

    prompt = "Ten of clubs."
    r = transcribe(client, stream="true", prompt=prompt, vad="false")
    done = sse_events(r.text)[-1]
    usage = TranscriptionTextDoneEvent.model_validate(done).usage
    assert usage is not None and usage.input_token_details is not None, done
    assert usage.input_token_details.text_tokens == len(get_tokenizer(False).encode(" " + prompt))
    assert usage.input_token_details.audio_tokens == 2 * 50
    assert usage.input_tokens == usage.input_token_details.text_tokens + usage.input_token_details.audio_tokens
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert (usage.output_tokens > 0) == bool(done["text"])
    # the answers not streamed keep OpenAI's duration usage (verbose_json takes no other)
    assert transcribe(client, response_format="verbose_json", vad="false").json()["usage"] == \
        {"type": "duration", "seconds": 2.0}


@pytest.mark.parametrize("model", ["gpt-4o-transcribe", "gpt-4o-mini-transcribe", "gpt-4o-mini-transcribe-2025-12-15"])
def test_a_json_answer_for_a_model_billed_by_tokens_gives_token_usage(client: TestClient[Any], model: str) -> None:
    """OpenAI answers gpt-4o-transcribe's json with token usage, whisper-1's with seconds (openai-python's
    Transcription.usage: UsageTokens | UsageDuration): the type was the route's (a stream said tokens, its json
    seconds). Counted as a stream counts them; verbose_json, whisper-1's alone at OpenAI, keeps the seconds."""
    from openai.types.audio import Transcription

    prompt = "Ten of clubs."
    body = transcribe(client, model=model, prompt=prompt, vad="false").json()
    usage = Transcription.model_validate(body).usage
    streamed = sse_events(transcribe(client, model=model, prompt=prompt, vad="false", stream="true").text)[-1]["usage"]
    assert usage is not None and usage.type == "tokens", body
    assert usage.input_token_details is not None and usage.input_token_details.audio_tokens == 2 * 50
    assert (usage.input_tokens, usage.input_token_details.text_tokens) == \
        (streamed["input_tokens"], streamed["input_token_details"]["text_tokens"])
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert (usage.output_tokens > 0) == bool(body["text"])
    assert transcribe(client, prompt=prompt, vad="false").json()["usage"] == {"type": "duration", "seconds": 2.0}
    assert transcribe(client, model=model, response_format="verbose_json", vad="false").json()["usage"] == \
        {"type": "duration", "seconds": 2.0}


def test_raw_pcm_upload(client: TestClient[Any]) -> None:
    r = client.post("/v1/audio/transcriptions", data={"model": "whisper-1", "temperature": "1.0"},
                    files={"file": ("a.pcm", voiced(1).astype("<f4").tobytes(), "audio/pcm;rate=16000")})
    assert r.status_code == 200, r.text


def test_an_l16_upload_is_read_big_endian(client: TestClient[Any]) -> None:
    x = (voiced(1.5) * 32767).astype("<i2")

    def upload(body: bytes, content_type: str) -> Any:
        r = client.post("/v1/audio/transcriptions", data={"temperature": "0", "response_format": "verbose_json"},
                        files={"file": ("a.pcm", body, content_type)})
        assert r.status_code == 200, r.text
        return r.json()["segments"]

    little = upload(x.tobytes(), "audio/pcm;rate=16000;encoding=s16le")
    assert upload(x.astype(">i2").tobytes(), "audio/L16;rate=16000") == little  # RFC 2586: network byte order


def test_a_wav_uploaded_as_raw_pcm_is_read_as_the_wav(client: TestClient[Any]) -> None:
    # The part's type switched a WAV to raw samples: audio/L16 read its header and samples big-endian (a 200 with
    # empty text), audio/pcm as float32 (a 400 "PCM contains NaN"). OpenAI decides by the file itself.
    wav = wav_bytes(voiced(1.5))

    def upload(content_type: str) -> Any:
        r = client.post("/v1/audio/transcriptions", data={"temperature": "0", "response_format": "verbose_json"},
                        files={"file": ("a.wav", wav, content_type)})
        assert r.status_code == 200, (content_type, r.text)
        return r.json()

    as_wav = upload("audio/wav")
    for declared in ("audio/L16;rate=16000", "audio/pcm", "audio/pcm;rate=24000;encoding=s16le"):
        assert upload(declared) == as_wav, declared


def test_a_g711_upload_is_read_by_its_type_and_an_au_file_as_the_file(client: TestClient[Any]) -> None:
    ulaw = encode_g711(voiced(0.75), "ulaw")  # 12,000 codes: 1.5 s at G.711's 8 kHz

    def upload(body: bytes, content_type: str) -> Any:
        r = client.post("/v1/audio/transcriptions", data={"temperature": "0", "response_format": "verbose_json"},
                        files={"file": ("a.ulaw", body, content_type)})
        assert r.status_code == 200, (content_type, r.text)
        return r.json()

    raw = upload(ulaw, "audio/basic")
    assert raw["duration"] == pytest.approx(1.5) and upload(ulaw, "audio/PCMU") == raw
    alaw = encode_g711(voiced(0.75), "alaw")
    pcma = upload(alaw, "audio/pcma")
    assert pcma["duration"] == pytest.approx(1.5)
    # telephony's names for them (Asterisk, Twilio): a generic 400 unsupported_or_corrupt_audio before
    assert upload(ulaw, "audio/x-mulaw;rate=8000") == upload(ulaw, "audio/mulaw") == raw
    assert upload(alaw, "audio/x-alaw") == upload(alaw, "audio/alaw;rate=8000") == pcma
    # Sun's .au, audio/basic's usual file (header: offset, size, 1 = 8-bit μ-law, rate, channels), decoded as the
    # file: its header is not read as samples
    note = b"\0" * 800  # an annotation after the header: read as samples, 0.1 s more audio
    au = b".snd" + struct.pack(">5I", 24 + len(note), len(ulaw), 1, 8000, 1) + note + ulaw
    as_file = upload(au, "audio/basic")
    # the whole reply once differed in CI in a segment's scores (a random model's near-ties beside another batch
    # mate), so what the header decides is compared: the audio's length, and the text
    assert (as_file["duration"], as_file["text"]) == (raw["duration"], raw["text"])


def test_a_bad_raw_pcm_upload_names_the_file(client: TestClient[Any]) -> None:
    r = client.post("/v1/audio/transcriptions", data={"model": "whisper-1"},
                    files={"file": ("a.pcm", b"\x00" * 5, "audio/pcm;rate=16000")})
    assert assert_error(r, 400, "invalid_pcm_length")["param"] == "file"


@pytest.mark.parametrize("audio, fields, status, code", [
    (b"not audio" * 50, {}, 400, "unsupported_or_corrupt_audio"),
    (None, {"model": "gpt-4o"}, 404, "model_not_found"),
    (None, {"language": "klingon"}, 400, "invalid_value"),
    (None, {"language": "de"}, 400, "invalid_value"),
    (None, {"response_format": "docx"}, 400, None),
    (None, {"temperature": "3"}, 400, None),
    (wav_bytes(voiced(0.006)), {}, 400, "audio_too_short"),  # 6 ms: under OpenAI's 0.1 s
])
def test_transcription_bad_input(client: TestClient[Any], audio: bytes | None, fields: dict[str, str], status: int,
                                 code: str | None) -> None:
    assert_error(transcribe(client, audio or b"", **fields), status, code)


def _claiming(rate: int, samples: int) -> bytes:
    """A 16-bit WAV whose header says `rate` (wave refuses to write absurd ones)."""
    import struct

    data = np.zeros(samples, "<i2").tobytes()
    return (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
            + b"data" + struct.pack("<I", len(data)) + data)


def test_audio_past_the_servers_bounds_is_a_400_not_a_blown_worker(client: TestClient[Any],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # A 40 KB file "at 1 Hz" once grew the worker by 3.6 GB (resampled to 5.5 h); 300 KB killed it.
    err = assert_error(transcribe(client, _claiming(1, 20000)), 400, "unsupported_sample_rate")
    assert err["param"] == "file"
    config = client.app.state[STATE_KEY].config
    monkeypatch.setattr(config, "limits", dataclasses.replace(config.limits, max_audio_seconds=1.5))
    err = assert_error(transcribe(client, wav_bytes(voiced(2))), 400, "audio_too_long")
    assert err["param"] == "file" and "1.5 s" in err["message"]
    assert transcribe(client, wav_bytes(voiced(1))).status_code == 200


@pytest.mark.parametrize("fields, param, code", [
    ({"include[]": "logprobs", "response_format": "srt"}, "include[]", "invalid_value"),  # json only, as OpenAI's
    ({"include[]": ""}, "include[]", "invalid_value"),
    ({"timestamp_granularities[]": "sentence"}, "timestamp_granularities[]", "invalid_value"),  # not `…[].0`
    ({"vad_trim": "true"}, "vad_trim", "invalid_value"),  # VAD is on here: only the speech is decoded already
    ({"vad_trim": "true", "chunking_strategy": "auto"}, "vad_trim", "invalid_value"),
    ({"known_speaker_names[]": "ann"}, "known_speaker_names[]", "unknown_parameter"),
    ({"some_future_field": "1"}, "some_future_field", "unknown_parameter"),
    ({"timestamp_granularities[]": "word"}, "timestamp_granularities[]", "invalid_value"),  # only in verbose_json
    ({"timestamp_granularities[]": "word", "response_format": "srt"}, "timestamp_granularities[]", "invalid_value"),
    ({"stream": "true", "response_format": "srt"}, "stream", "invalid_value"),
    ({"chunking_strategy": "auto", "vad": "false"}, "chunking_strategy", "invalid_value"),
    ({"chunking_strategy": "server_vad"}, "chunking_strategy", "invalid_value"),
    ({"chunking_strategy[type]": "server_vad", "vad": "false"}, "chunking_strategy", "invalid_value"),
    ({"chunking_strategy[type]": "semantic_vad"}, "chunking_strategy.type", "invalid_value"),
    ({"chunking_strategy[type]": "server_vad", "chunking_strategy[eagerness]": "low"}, "chunking_strategy.eagerness",
     "unknown_parameter"),
    # the demo's tiny.en is English-only: every entry must be English, and the one at fault is named
    ({"languages[]": ["en", "de"]}, "languages[1]", "invalid_value"),
    ({"language": "en", "languages[]": "fr"}, "languages[0]", "invalid_value"),
    ({"languages[]": "de"}, "languages[0]", "invalid_value"),
    ({"languages[0]": "English", "languages[1]": ""}, "languages[1]", "invalid_value"),
])
def test_a_transcription_field_that_cannot_be_honoured_is_refused_by_name(
        client: TestClient[Any], fields: dict[str, str], param: str | None, code: str) -> None:
    err = assert_error(transcribe(client, **fields), 400, code)
    assert err["param"] == param, err


def test_include_says_what_it_takes_and_vad_trim_works_with_vad_off(client: TestClient[Any]) -> None:
    err = assert_error(transcribe(client, **{"include[]": ""}), 400, "invalid_value")
    assert "logprobs is the one include value" in err["message"]
    assert transcribe(client, vad_trim="true", vad="false").status_code == 200


@pytest.mark.parametrize("field", ["model", "language", "include[]", "timestamp_granularities[]"])
def test_a_huge_value_is_not_echoed_whole(client: TestClient[Any], field: str) -> None:
    answer = transcribe(client, **{field: "x" * 100_000})
    assert answer.status_code in (400, 404) and len(answer.content) < 1000, answer.text[:200]
    assert "…" in answer.json()["error"]["message"]


def test_a_huge_content_type_is_not_echoed_whole(client: TestClient[Any]) -> None:
    sid = client.post("/v1/audio/sessions", json={}).json()["id"]
    for content_type in ("audio/pcm;encoding=" + "x" * 20_000, "audio/pcm;rate=" + "9" * 20_000):
        answer = client.post(f"/v1/audio/sessions/{sid}/audio", content=b"\0" * 4,
                             headers={"content-type": content_type})
        assert answer.status_code == 400 and len(answer.content) < 1000
    client.delete(f"/v1/audio/sessions/{sid}")


def test_chunking_strategy_auto_is_voice_activity_cutting(client: TestClient[Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import service.speech.transcriptions as routes

    asked: list[Any] = []
    real = routes.transcribe_options
    monkeypatch.setattr(routes, "transcribe_options", lambda *a, **kw: asked.append(kw["vad"]) or real(*a, **kw))
    assert transcribe(client, chunking_strategy="auto").status_code == 200
    assert transcribe(client).status_code == 200
    assert asked == [True, None]  # auto: on whatever the server's default; without it, the default


def _asked(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What the route asks the speech service for (its transcribe_options keywords), one dict a request."""
    import service.speech.transcriptions as routes

    asked: list[dict[str, Any]] = []
    real = routes.transcribe_options
    monkeypatch.setattr(routes, "transcribe_options", lambda *a, **kw: asked.append(kw) or real(*a, **kw))
    return asked


def test_keywords_join_the_prompt_and_languages_go_to_the_speech_service(client: TestClient[Any],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # openai 3.63 sends `keywords[]` and `languages[]` (Pipecat's OpenAISTTService sends keywords whatever the model):
    # read as /v1/realtime reads a session's keywords and languages
    from service.speech.realtime_config import RealtimeConfig

    asked = _asked(monkeypatch)
    assert transcribe(client, prompt="Dashwood", **{"keywords[]": ["Marianne", "Elinor"]}).status_code == 200
    assert transcribe(client, **{"keywords[]": "Marianne", "languages[]": ["en", "English"]}).status_code == 200
    assert [(a["prompt"], a["languages"]) for a in asked] == [("Dashwood Marianne, Elinor", []),
                                                             ("Marianne", ["en", "English"])]
    live = RealtimeConfig(keywords=["Marianne", "Elinor"], prompt="Dashwood")
    assert live.full_prompt == asked[0]["prompt"]
    updated = live.updated({"input_audio_transcription": {"languages": ["en", "English"]}}, "beta")
    assert updated.decoding()["languages"] == tuple(asked[1]["languages"])


@pytest.mark.parametrize("settings", [{}, {"silence_duration_ms": 300, "prefix_padding_ms": 100, "threshold": 0.9}])
def test_a_server_vad_chunking_strategy_is_honoured_as_form_parts_or_one_json_field(
        client: TestClient[Any], monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any]) -> None:
    asked = _asked(monkeypatch)
    parts = {f"chunking_strategy[{k}]": str(v) for k, v in {"type": "server_vad", **settings}.items()}
    assert transcribe(client, **parts).status_code == 200
    assert transcribe(client, chunking_strategy=json.dumps({"type": "server_vad", **settings})).status_code == 200
    assert transcribe(client, chunking_strategy="auto").status_code == 200
    vad = [{k: v for k, v in a.items() if k.startswith("vad") and k != "vad_trim"} for a in asked]
    want = {"vad_min_silence_ms": 300, "vad_padding_ms": 100, "vad_aggressiveness": 3} if settings else {}
    assert vad == [{"vad": True, **want}, {"vad": True, **want}, {"vad": True}]  # no settings: auto's


def test_a_server_vad_setting_out_of_range_is_refused_by_name_alike_in_either_encoding(
        client: TestClient[Any]) -> None:
    as_parts = transcribe(client, **{"chunking_strategy[type]": "server_vad",
                                     "chunking_strategy[silence_duration_ms]": "5"})
    as_json = transcribe(client, chunking_strategy='{"type": "server_vad", "silence_duration_ms": 5}')
    err = assert_error(as_parts, 400, "invalid_value")
    assert err == assert_error(as_json, 400, "invalid_value")
    assert err["param"] == "chunking_strategy.silence_duration_ms"


def test_missing_file_and_empty_file(client: TestClient[Any]) -> None:
    assert_error(client.post("/v1/audio/transcriptions", data={"model": "whisper-1"}, files={"x": ("a", b"1")}), 400)
    r = client.post("/v1/audio/transcriptions", data={"model": "whisper-1"}, files={"file": ("a.wav", b"", "audio/wav")})
    assert_error(r, 400, "empty_audio")


def test_a_file_part_without_a_filename_is_the_file(client: TestClient[Any]) -> None:
    # the openai SDK's `file=(None, data, "audio/wav")`: Litestar read the part as text, a 400 naming nothing
    files = {"file": (None, wav_bytes(voiced(1.5)), "audio/wav")}
    r = client.post("/v1/audio/transcriptions", data={"temperature": "1.0", "response_format": "verbose_json"},
                    files=files)
    assert r.status_code == 200, r.text
    assert r.json()["duration"] == pytest.approx(1.5)
    # a text field that is no text is refused naming it
    r = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav_bytes(voiced(1.5)), "audio/wav"),
                                                       "prompt": (None, b"\xff\xfe\x00audio", "text/plain")})
    assert assert_error(r, 400, "invalid_encoding")["param"] == "prompt"


def test_file_over_the_size_limit(client: TestClient[Any]) -> None:
    r = client.post("/v1/audio/transcriptions", data={"model": "whisper-1"},
                    files={"file": ("a.wav", b"\x00" * (26 * 1024 * 1024), "audio/wav")})
    assert_error(r, 413, "request_too_large")


def test_session_lifecycle(client: TestClient[Any]) -> None:
    r = client.post("/v1/audio/sessions", json={"language": "en", "vocabulary": ["Kenobi"], "temperature": 1.0})
    assert r.status_code == 200, r.text
    sid = r.json()["id"]
    pcm = voiced(1.5)
    for i in range(0, len(pcm), SR // 4):
        r = client.post(f"/v1/audio/sessions/{sid}/audio", content=pcm[i:i + SR // 4].astype("<f4").tobytes(),
                        headers={"content-type": "audio/pcm;rate=16000"})
        assert r.status_code == 200, r.text
    assert r.json()["received_seconds"] == pytest.approx(1.5) and r.json()["windows_done"] == 0
    assert 0.0 <= r.json()["lag_seconds"] <= 1.5  # how far behind: the backlog a fast sender watches
    # a bad chunk is refused, the audio before it is kept
    assert_error(client.post(f"/v1/audio/sessions/{sid}/audio", content=b"\x00" * 5,
                             headers={"content-type": "audio/pcm"}), 400, "invalid_pcm_length")
    assert_error(client.post(f"/v1/audio/sessions/{sid}/audio", content=b"\x00" * 4,
                             headers={"content-type": "audio/pcm;rate=96000"}), 400, "unsupported_sample_rate")
    assert_error(client.post(f"/v1/audio/sessions/{sid}/audio", content=b"",
                             headers={"content-type": "audio/pcm"}), 400, "empty_audio")
    s16 = (voiced(0.5) * 32767).astype("<i2").tobytes()
    r = client.post(f"/v1/audio/sessions/{sid}/audio", content=s16,
                    headers={"content-type": "audio/pcm;rate=48000;encoding=s16le"})
    assert r.json()["received_seconds"] == pytest.approx(1.5 + 0.5 / 3, abs=0.03)  # soxr holds a few ms until finish
    r = client.post(f"/v1/audio/sessions/{sid}/finish")
    assert r.status_code == 200, r.text
    body = r.json()
    # the language by name, as verbose_json gives it
    assert body["id"] == sid and body["language"] == "english" and body["duration"] == pytest.approx(1.667, abs=0.01)
    assert client.post(f"/v1/audio/sessions/{sid}/finish").json() == body  # idempotent
    assert_error(client.post(f"/v1/audio/sessions/{sid}/audio", content=s16,
                             headers={"content-type": "audio/pcm;encoding=s16le"}), 409, "session_closed")
    r = client.delete(f"/v1/audio/sessions/{sid}")
    assert r.status_code == 200 and r.json() == {"id": sid, "object": "audio.session", "deleted": True}
    assert_error(client.post(f"/v1/audio/sessions/{sid}/finish"), 404, "session_not_found")


def test_g711_chunks_in_a_session(client: TestClient[Any]) -> None:
    sid = client.post("/v1/audio/sessions", json={"language": "en", "temperature": 1.0}).json()["id"]
    chunks = [(encode_g711(voiced(0.25), "ulaw"), "audio/pcmu"),  # 4,000 codes: 0.5 s at 8 kHz
              (encode_g711(voiced(0.25), "alaw"), "audio/pcma"),
              (encode_g711(voiced(0.125), "ulaw")[:1999], "audio/basic"),  # one byte a sample: any count is whole
              (encode_g711(voiced(0.25), "ulaw"), "audio/pcm;encoding=ulaw;rate=16000")]
    for body, content_type in chunks:
        r = client.post(f"/v1/audio/sessions/{sid}/audio", content=body, headers={"content-type": content_type})
        assert r.status_code == 200, (content_type, r.text)
    r = client.post(f"/v1/audio/sessions/{sid}/finish")
    assert r.status_code == 200, r.text
    assert r.json()["duration"] == pytest.approx(0.5 + 0.5 + 1999 / 8000 + 0.25, abs=0.002)
    client.delete(f"/v1/audio/sessions/{sid}")


def test_a_g711_chunk_whose_encoding_contradicts_its_type_is_refused(client: TestClient[Any]) -> None:
    # audio/x-mulaw;encoding=alaw was taken as A-law, audio/x-mulaw;encoding=s16le as PCM16: which one was sent?
    sid = client.post("/v1/audio/sessions", json={"language": "en"}).json()["id"]
    body = encode_g711(voiced(0.25), "ulaw")
    for content_type in ("audio/x-mulaw;encoding=alaw", "audio/x-alaw;encoding=ulaw", "audio/x-mulaw;encoding=s16le"):
        r = client.post(f"/v1/audio/sessions/{sid}/audio", content=body, headers={"content-type": content_type})
        err = assert_error(r, 400, "invalid_content_type")
        assert err["param"] == "encoding" and "contradicts audio/x-" in err["message"], err
    r = client.post(f"/v1/audio/sessions/{sid}/audio", content=body,
                    headers={"content-type": "audio/x-mulaw;encoding=ulaw"})  # its own encoding is fine
    assert r.status_code == 200, r.text
    r = client.post(f"/v1/audio/sessions/{sid}/finish")  # only that chunk was taken
    assert r.status_code == 200 and r.json()["duration"] == pytest.approx(0.5, abs=0.002), r.text
    client.delete(f"/v1/audio/sessions/{sid}")


def test_a_live_text_has_no_leading_space(client: TestClient[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from audio.live import LiveTranscription

    real = LiveTranscription.transcript

    def spoken(self: LiveTranscription, duration: float) -> Any:
        t = real(self, duration)
        t.text = " And Mr. Dashwood"  # as Whisper writes it
        return t

    monkeypatch.setattr(LiveTranscription, "transcript", spoken)
    sid = client.post("/v1/audio/sessions", json={}).json()["id"]
    assert client.post(f"/v1/audio/sessions/{sid}/finish").json()["text"] == "And Mr. Dashwood"
    with client.websocket_connect("/v1/audio/live?interval=0") as ws:
        ws.receive_json()
        ws.send_text('{"type": "finish"}')
        while (m := ws.receive_json())["type"] != "transcript.done":
            pass
    assert m["text"] == "And Mr. Dashwood"


def test_session_accepts_a_wav_chunk(client: TestClient[Any]) -> None:
    sid = client.post("/v1/audio/sessions", json={}).json()["id"]
    r = client.post(f"/v1/audio/sessions/{sid}/audio", content=wav_bytes(voiced(0.5), 8000),  # 8000 samples at 8 kHz
                    headers={"content-type": "audio/wav"})
    assert r.status_code == 200 and r.json()["received_seconds"] == pytest.approx(1.0, abs=0.01)
    client.delete(f"/v1/audio/sessions/{sid}")


def test_unknown_session_and_bad_session_options(client: TestClient[Any]) -> None:
    assert_error(client.post("/v1/audio/sessions/sess_nope/audio", content=b"\x00" * 4,
                             headers={"content-type": "audio/pcm"}), 404, "session_not_found")
    assert_error(client.delete("/v1/audio/sessions/sess_nope"), 404)
    assert_error(client.post("/v1/audio/sessions", json={"language": "xx-nope"}), 400)
    assert_error(client.post("/v1/audio/sessions", json={"vad_min_speech_ms": 1}), 400)
    err = assert_error(client.post("/v1/audio/sessions", json={"vad_min_silence": 300}), 400, "unknown_parameter")
    assert err["param"] == "vad_min_silence"


def test_deleted_session_refuses_audio(client: TestClient[Any]) -> None:
    sid = client.post("/v1/audio/sessions", json={}).json()["id"]
    client.post(f"/v1/audio/sessions/{sid}/audio", content=voiced(0.5).tobytes(), headers={"content-type": "audio/pcm"})
    client.delete(f"/v1/audio/sessions/{sid}")
    assert_error(client.post(f"/v1/audio/sessions/{sid}/audio", content=voiced(0.5).tobytes(),
                             headers={"content-type": "audio/pcm"}), 404)


def test_websocket_live_partials_and_done(client: TestClient[Any]) -> None:
    with client.websocket_connect("/v1/audio/live?interval=0.2") as ws:
        created = ws.receive_json()
        assert created["type"] == "session.created"
        for i in range(4):
            ws.send_bytes(voiced(0.25).astype("<f4").tobytes())
        ws.send_text('{"type": "finish"}')
        messages = []
        while (m := ws.receive_json())["type"] != "transcript.done":
            messages.append(m)
        assert m["received_seconds"] == pytest.approx(1.0)
        assert all(x["type"] == "transcript.partial" and 0.0 <= x["lag_seconds"] <= 1.0 for x in messages)


def test_no_speech_server_says_so() -> None:
    with TestClient(create_app(AppState())) as c:
        assert_error(transcribe(c), 404, "model_not_found")
        # What to do about it: --no-whisper is how a server comes to serve none.
        assert "without --no-whisper" in transcribe(c).json()["error"]["message"]
        # Before any word on the body: a fixed body would only meet the 404 next.
        assert_error(c.post("/v1/audio/transcriptions", json={"model": "whisper-1"}), 404, "model_not_found")


@pytest.mark.parametrize("warmup", [True, False])
def test_the_server_warms_whisper_up_before_ready_when_told(whisper_dir: Path, warmup: bool) -> None:
    from service.config import ServiceConfig

    state = install_speech(AppState(config=ServiceConfig(warmup=warmup)), SpeechConfig(model=str(whisper_dir)))
    with TestClient(create_app(state)) as c:
        assert c.get("/health").status_code == 200
        speech = c.get("/stats").json()["speech"]
        assert speech["loads"] == (1 if warmup else 0)  # not preloaded: loaded for the warm-up only
        assert speech["scheduler"]["windows_done"] == 0 and speech["scheduler"]["costs"] == {}


def test_keywords_that_make_the_prompt_too_long_are_named(client: TestClient[Any]) -> None:
    # a 1 MB keyword was refused as `prompt`, which the client had not sent
    err = assert_error(transcribe(client, **{"keywords[]": ["x" * 3000]}), 400)
    assert err["param"] == "keywords[]" and "keywords joined" in err["message"]
    err = assert_error(transcribe(client, prompt="p" * 3000, **{"keywords[]": ["x"]}), 400)
    assert err["param"] == "prompt"  # the prompt alone was too long


def test_a_form_of_too_many_parts_is_a_413_that_says_so(client: TestClient[Any]) -> None:
    # Litestar's "Request Entity Too Large" came as a 400 naming nothing (1,000 keywords[] entries)
    err = assert_error(transcribe(client, **{"keywords[]": [f"w{i}" for i in range(1001)]}), 413, "request_too_large")
    assert "parts" in err["message"] and "keywords[]" in err["message"]
