"""Client secrets: the store (kept hashed, expiring, bounded per minting key) and the routes that mint them, OpenAI's
GA `POST /v1/realtime/client_secrets` and beta `POST /v1/realtime/transcription_sessions`: their shapes, defaults and
refusals by field name."""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.config import ServiceConfig
from service.speech.client_secret_routes import BETA_DEFAULT_SECONDS
from service.speech.client_secrets import ClientSecrets
from service.speech.setup import SpeechConfig, install_speech
from service.state import AppState
from tests.fixtures.tiny_whisper import build_tiny_whisper

KEY = "alpha"
GA = "/v1/realtime/client_secrets"
BETA = "/v1/realtime/transcription_sessions"


# ------------------------------------------------------------------ the store


def test_a_secret_is_kept_only_as_its_digest() -> None:
    store = ClientSecrets()
    value, secret = store.mint("key-a", 60, None, "ga")
    assert value.startswith("ek_") and len(value) > 40
    assert store.find(value) == secret and store.find(value.encode()) == secret
    assert all(value.encode() not in repr(k).encode() for k in store._secrets)  # noqa: SLF001 — the store's keys
    assert store.find("ek_" + "x" * 43) is None and store.find("sk-" + value) is None


def test_a_secret_expires_at_its_time() -> None:
    now = [1000.0]
    store = ClientSecrets(clock=lambda: now[0])
    value, secret = store.mint(None, 10, None, "ga")
    assert secret.expires_at == 1010
    now[0] = 1009.9
    assert store.find(value) is not None and not store.expired(value.encode())
    now[0] = 1010.0
    assert store.find(value) is None and store.expired(value.encode())
    store.mint(None, 10, None, "ga")  # minting drops what has expired
    assert len(store) == 1


def test_minting_is_bounded_per_key_dropping_that_keys_oldest() -> None:
    store = ClientSecrets(per_owner=3)
    other, _ = store.mint("key-b", 600, None, "ga")
    mine = [store.mint("key-a", 600, None, "ga")[0] for _ in range(5)]
    assert len(store) == 4
    assert [store.find(v) is not None for v in mine] == [False, False, True, True, True]
    assert store.find(other) is not None  # one key's minting never pushes out another key's secrets


def test_the_session_is_copied_at_minting() -> None:
    store = ClientSecrets()
    session: dict[str, Any] = {"type": "transcription", "include": []}
    value, _ = store.mint(None, 60, session, "ga")
    session["include"].append("x")
    secret = store.find(value)
    assert secret is not None and secret.session == {"type": "transcription", "include": []}


# ------------------------------------------------------------------ the routes


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient[Any]]:
    whisper = build_tiny_whisper(tmp_path_factory.mktemp("tiny_whisper"))
    state = install_speech(AppState(config=ServiceConfig(api_keys=[KEY])),
                           SpeechConfig(model=str(whisper), resident=True))
    with TestClient(create_app(state)) as c:
        c.headers["authorization"] = f"Bearer {KEY}"
        yield c


def _error(answer: Any, param: str) -> str:
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param, error
    code: str = error["code"]
    return code


def test_a_client_secret_is_minted_in_openais_shape(client: TestClient[Any]) -> None:
    before = int(time.time())
    answer = client.post(GA, json={})
    assert answer.status_code == 200, answer.text
    minted = answer.json()
    assert set(minted) == {"value", "expires_at", "session"} and minted["value"].startswith("ek_")
    assert before + 600 <= minted["expires_at"] <= int(time.time()) + 600  # OpenAI's default
    session = minted["session"]
    assert session["type"] == "transcription" and session["object"] == "realtime.transcription_session"
    assert session["id"].startswith("sess_") and session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    shorter = client.post(GA, json={"expires_after": {"anchor": "created_at", "seconds": 10}}).json()
    assert shorter["expires_at"] <= int(time.time()) + 10


def test_the_session_given_is_what_the_answer_shows(client: TestClient[Any]) -> None:
    minted = client.post(GA, json={"session": {
        "type": "transcription", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000},
                                                     "transcription": {"model": "whisper-1", "language": "en",
                                                                       "keywords": ["Dashwood"]},
                                                     "turn_detection": {"type": "server_vad",
                                                                        "silence_duration_ms": 700}}}}}).json()
    audio_in = minted["session"]["audio"]["input"]
    assert audio_in["format"] == {"type": "audio/pcm", "rate": 16000}
    assert audio_in["transcription"] == {"model": "whisper-1", "language": "en", "prompt": None,
                                         "keywords": ["Dashwood"]}
    assert audio_in["turn_detection"]["silence_duration_ms"] == 700


def test_a_telephony_session_is_minted_with_g711(client: TestClient[Any]) -> None:
    ga = client.post(GA, json={"session": {"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/pcma"}}}}})
    assert ga.status_code == 200, ga.text
    assert ga.json()["session"]["audio"]["input"]["format"] == {"type": "audio/pcma"}
    beta = client.post(BETA, json={"input_audio_format": "g711_ulaw"})
    assert beta.status_code == 200, beta.text
    assert beta.json()["input_audio_format"] == "g711_ulaw"


def test_a_minted_semantic_vad_session_is_shown_as_sent(client: TestClient[Any]) -> None:
    minted = client.post(GA, json={"session": {"type": "transcription", "audio": {"input": {
        "turn_detection": {"type": "semantic_vad", "eagerness": "low"}}}}})
    assert minted.status_code == 200, minted.text
    assert minted.json()["session"]["audio"]["input"]["turn_detection"] == {"type": "semantic_vad", "eagerness": "low"}
    beta = client.post(BETA, json={"turn_detection": {"type": "semantic_vad"}}).json()
    assert beta["turn_detection"] == {"type": "semantic_vad", "eagerness": "auto"}


@pytest.mark.parametrize("body, param", [
    ({"expires_after": {"seconds": 5}}, "expires_after.seconds"),
    ({"expires_after": {"seconds": 7201}}, "expires_after.seconds"),
    ({"expires_after": {"anchor": "now"}}, "expires_after.anchor"),
    ({"expires_after": {"seconds": 60, "ttl": 1}}, "expires_after.ttl"),
    ({"sesion": {}}, "sesion"),
    ({"session": {"type": "realtime"}}, "session.type"),
    ({"session": {"type": "transcription", "voice": "alloy"}}, "session.voice"),
    ({"session": {"type": "transcription", "audio": {"input": {"noise_reduction": {"type": "studio"}}}}},
     "session.audio.input.noise_reduction.type"),
    ({"session": {"type": "transcription", "audio": {"input": {"transcription": {"language": "xx"}}}}},
     "session.audio.input.transcription.language"),
    ({"session": {"type": "transcription", "audio": {"input": {"turn_detection": {"type": "near_field_vad"}}}}},
     "session.audio.input.turn_detection.type"),
    ({"session": {"type": "transcription", "audio": {"input": {"turn_detection": {"type": "semantic_vad",
                                                                                  "eagerness": "eager"}}}}},
     "session.audio.input.turn_detection.eagerness"),
    ({"session": {"type": "transcription", "include": ["item.input_audio_transcription.words"]}},
     "session.include"),
    ({"session": {"type": "transcription", "audio": {"input": {"transcription": {"prompt": "p" * 70_000}}}}},
     "session"),
])
def test_what_cannot_be_honoured_is_refused_naming_it(client: TestClient[Any], body: dict[str, Any],
                                                     param: str) -> None:
    _error(client.post(GA, json=body), param)


def test_another_model_is_refused_naming_it(client: TestClient[Any]) -> None:
    answer = client.post(GA, json={"session": {"type": "transcription",
                                               "audio": {"input": {"transcription": {"model": "gpt-9"}}}}})
    assert answer.status_code == 404
    assert answer.json()["error"]["param"] == "session.audio.input.transcription.model"


def test_a_beta_transcription_session_carries_its_client_secret(client: TestClient[Any]) -> None:
    before = int(time.time())
    answer = client.post(BETA, json={"input_audio_format": "pcm16", "modalities": ["text"],
                                     "input_audio_transcription": {"model": "whisper-1", "language": "en",
                                                                   "prompt": "Dashwood"},
                                     "turn_detection": {"type": "server_vad", "threshold": 0.8}})
    assert answer.status_code == 200, answer.text
    session = answer.json()
    assert session["object"] == "realtime.transcription_session" and session["id"].startswith("sess_")
    assert session["client_secret"]["value"].startswith("ek_")
    assert before + BETA_DEFAULT_SECONDS <= session["client_secret"]["expires_at"] <= time.time() + BETA_DEFAULT_SECONDS
    assert session["input_audio_format"] == "pcm16" and session["modalities"] == ["text"]
    assert session["input_audio_transcription"] == {"model": "whisper-1", "language": "en", "prompt": "Dashwood"}
    assert session["turn_detection"]["threshold"] == 0.8
    longer = client.post(BETA, json={"client_secret": {"expires_at": {"anchor": "created_at", "seconds": 3600}}})
    assert longer.json()["client_secret"]["expires_at"] >= before + 3600


@pytest.mark.parametrize("body, param", [
    ({"voice": "alloy"}, "voice"),
    ({"input_audio_format": "g722"}, "input_audio_format"),
    ({"modalities": ["audio", "text"]}, "modalities"),
    ({"input_audio_transcription": {"language": "en", "temperature": 0}}, "input_audio_transcription.temperature"),
    ({"turn_detection": {"type": "near_field_vad"}}, "turn_detection.type"),
    ({"turn_detection": {"type": "semantic_vad", "threshold": 0.8}}, "turn_detection.threshold"),
    ({"client_secret": {"expires_at": {"seconds": 1}}}, "client_secret.expires_at.seconds"),
    ({"client_secret": {"value": "mine"}}, "client_secret.value"),
])
def test_the_beta_route_refuses_by_name_too(client: TestClient[Any], body: dict[str, Any], param: str) -> None:
    _error(client.post(BETA, json=body), param)


def test_minting_needs_the_api_key(client: TestClient[Any]) -> None:
    assert client.post(GA, json={}, headers={"authorization": "Bearer nope"}).status_code == 401
    assert client.post(BETA, json={}, headers={"authorization": "Bearer nope"}).status_code == 401
