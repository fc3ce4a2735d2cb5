"""The live websockets' handshake as OpenAI's browser clients make it: subprotocols `realtime`,
`openai-insecure-api-key.<key>` and `openai-beta.realtime-v1`; `realtime` selected, the key's never echoed, the key
read from it, the beta dialect told by it; client secrets opening sockets for the key that minted them, with the
session settings given at minting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
from litestar.exceptions import WebSocketDisconnect
from litestar.testing import TestClient

from service.app import create_app
from service.config import ServiceConfig
from service.http.auth import KeyRing
from service.speech.setup import SpeechConfig, install_speech
from service.state import AppState
from tests.fixtures.tiny_whisper import build_tiny_whisper

KEYS = ["alpha", "beta"]
RT = "/v1/realtime?intent=transcription"


def protocols(*names: str) -> dict[str, str]:
    return {"sec-websocket-protocol": ", ".join(names)}


def ga(key: str) -> dict[str, str]:
    """What OpenAI's JS SDK (OpenAIRealtimeWebSocket) offers."""
    return protocols("realtime", f"openai-insecure-api-key.{key}")


def beta(key: str) -> dict[str, str]:
    """What the beta SDK and OpenAI's beta browser examples offer."""
    return protocols("realtime", f"openai-insecure-api-key.{key}", "openai-beta.realtime-v1")


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_whisper(tmp_path_factory.mktemp("tiny_whisper"))


def _state(whisper_dir: Path, keys: list[str]) -> AppState:
    return install_speech(AppState(config=ServiceConfig(api_keys=keys)),
                          SpeechConfig(model=str(whisper_dir), resident=True, max_sessions=4))


@pytest.fixture(scope="module")
def keyed_state(whisper_dir: Path) -> AppState:
    return _state(whisper_dir, KEYS)


@pytest.fixture(scope="module")
def keyed(keyed_state: AppState) -> Iterator[TestClient[Any]]:
    with TestClient(create_app(keyed_state)) as c:
        yield c


@pytest.fixture(scope="module")
def open_state(whisper_dir: Path) -> AppState:
    return _state(whisper_dir, [])


@pytest.fixture(scope="module")
def keyless(open_state: AppState) -> Iterator[TestClient[Any]]:
    with TestClient(create_app(open_state)) as c:
        yield c


def _refused(client: TestClient[Any], path: str, headers: dict[str, str]) -> None:
    with pytest.raises(WebSocketDisconnect):
        with client.websocket_connect(path, headers=headers) as ws:
            ws.receive_json(timeout=30)


# ------------------------------------------------------------------ subprotocols


@pytest.mark.parametrize("path, offer, created", [
    (RT, ga("none"), "session.created"),
    (RT, beta("none"), "transcription_session.created"),
    ("/v1/audio/live?rate=48000", ga("none"), "session.created"),
    ("/v1/audio/live?rate=48000", beta("none"), "transcription_session.created"),
])
def test_realtime_is_selected_when_offered_and_the_key_is_never_echoed(keyless: TestClient[Any], path: str,
                                                                        offer: dict[str, str], created: str) -> None:
    with keyless.websocket_connect(path, headers=offer) as ws:
        assert ws.accepted_subprotocol == "realtime"  # a browser fails the connection without it
        assert ws.receive_json(timeout=30)["type"] == created


def test_no_subprotocol_is_selected_when_none_is_offered(keyless: TestClient[Any]) -> None:
    with keyless.websocket_connect(RT) as ws:
        assert ws.accepted_subprotocol is None
        assert ws.receive_json(timeout=30)["type"] == "session.created"


def test_a_browser_beta_client_gets_the_beta_dialect_from_its_subprotocol(keyless: TestClient[Any]) -> None:
    with keyless.websocket_connect(RT, headers=beta("none")) as ws:  # no OpenAI-Beta header: a browser cannot
        assert ws.receive_json(timeout=30)["type"] == "transcription_session.created"
        ws.send_text(json.dumps({"type": "transcription_session.update",
                                 "session": {"input_audio_transcription": {"language": "en"}}}))
        updated = ws.receive_json(timeout=30)
    assert updated["type"] == "transcription_session.updated"
    assert updated["session"]["input_audio_transcription"]["language"] == "en"


def test_the_beta_subprotocol_is_selected_when_realtime_is_not_offered(keyless: TestClient[Any],
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    # Chrome fails a handshake that selects none of the offered subprotocols ("Sent non-empty
    # 'Sec-WebSocket-Protocol' header but no response was received"); the server's log blamed the client.
    with keyless.websocket_connect(RT, headers=protocols("openai-insecure-api-key.x", "openai-beta.realtime-v1")) as ws:
        assert ws.accepted_subprotocol == "openai-beta.realtime-v1"
        assert ws.receive_json(timeout=30)["type"] == "transcription_session.created"
    with keyless.websocket_connect(RT, headers=protocols("openai-insecure-api-key.x")) as ws:
        assert ws.accepted_subprotocol is None  # never the key's
        ws.receive_json(timeout=30)
    assert "offer 'realtime'" in caplog.text


# ------------------------------------------------------------------ the key in a subprotocol


@pytest.mark.parametrize("path", [RT, "/v1/audio/live?rate=48000"])
def test_a_key_in_the_subprotocol_opens_the_socket_and_a_wrong_one_does_not(keyed: TestClient[Any], path: str) -> None:
    with keyed.websocket_connect(path, headers=ga(KEYS[1])) as ws:
        assert ws.accepted_subprotocol == "realtime"
        assert ws.receive_json(timeout=30)["type"] == "session.created"
    _refused(keyed, path, ga("wrong"))
    _refused(keyed, path, protocols("realtime"))


def test_the_key_protocol_authenticates_only_a_websocket() -> None:
    ring = KeyRing(KEYS)
    offered = [(b"sec-websocket-protocol", b"realtime, openai-insecure-api-key.alpha")]
    socket = {"type": "websocket", "headers": offered, "subprotocols": ["realtime", "openai-insecure-api-key.alpha"]}
    assert ring.match(socket) == KeyRing.key_id(b"alpha")
    assert ring.match({"type": "http", "headers": offered}) is None


# ------------------------------------------------------------------ client secrets


def _mint(client: TestClient[Any], key: str | None = KEYS[0], **body: Any) -> dict[str, Any]:
    answer = client.post("/v1/realtime/client_secrets", json=body,
                         headers={"authorization": f"Bearer {key}"} if key else {})
    assert answer.status_code == 200, answer.text
    minted: dict[str, Any] = answer.json()
    return minted


def test_a_minted_secret_opens_sockets_for_its_key_until_it_expires(keyed: TestClient[Any],
                                                                    keyed_state: AppState) -> None:
    minted = _mint(keyed)
    assert minted["value"].startswith("ek_")
    for _ in range(2):  # as OpenAI's: any number of sockets until it expires
        with keyed.websocket_connect(RT, headers=ga(minted["value"])) as ws:
            assert ws.accepted_subprotocol == "realtime"
            assert ws.receive_json(timeout=30)["type"] == "session.created"
    with keyed.websocket_connect("/v1/audio/live?rate=48000", headers=beta(minted["value"])) as ws:
        assert ws.receive_json(timeout=30)["type"] == "transcription_session.created"
    store = keyed_state.client_secrets
    clock = store.clock
    store.clock = lambda: minted["expires_at"] + 0.0
    try:
        _refused(keyed, RT, ga(minted["value"]))
    finally:
        store.clock = clock
    _refused(keyed, RT, ga("ek_" + minted["value"][3:][::-1]))  # not one it minted


def test_a_secret_or_a_served_whisper_model_needs_no_intent(keyed: TestClient[Any], keyed_state: AppState) -> None:
    # The JS SDK's OpenAIRealtimeWebSocket connects to /v1/realtime?model=M only: OpenAI takes the secret's session
    # type when intent is omitted. Both were refused "connect with ?intent=transcription" (close 1008).
    minted = _mint(keyed, session={"type": "transcription"})
    with keyed.websocket_connect("/v1/realtime", headers=ga(minted["value"])) as ws:
        assert ws.receive_json(timeout=30)["type"] == "session.created"
    assert keyed_state.speech is not None
    with keyed.websocket_connect(f"/v1/realtime?model={keyed_state.speech.model_name}", headers=ga(KEYS[0])) as ws:
        assert ws.receive_json(timeout=30)["type"] == "session.created"
    with keyed.websocket_connect("/v1/realtime?model=gpt-realtime", headers=ga(KEYS[0])) as ws:
        event = ws.receive_json(timeout=30)
    assert event["type"] == "error" and event["error"]["param"] == "intent"
    assert "?model= (e.g. gpt-4o-transcribe" in event["error"]["message"]  # a client that cannot add ?intent can


def test_a_secret_opens_no_http_route(keyed: TestClient[Any]) -> None:
    minted = _mint(keyed)
    for headers in ({"authorization": f"Bearer {minted['value']}"}, {"x-api-key": minted["value"]}):
        assert keyed.get("/v1/models", headers=headers).status_code == 401
        assert keyed.post("/v1/realtime/client_secrets", json={}, headers=headers).status_code == 401


def test_a_secret_belongs_to_the_key_that_minted_it(keyed: TestClient[Any], keyed_state: AppState) -> None:
    seen: list[str | None] = []
    ring = KeyRing(KEYS)
    for key in KEYS:
        minted = _mint(keyed, key)
        scope = {"type": "websocket", "headers": [], "subprotocols": [f"openai-insecure-api-key.{minted['value']}"],
                 "app": keyed.app}
        seen.append(ring.match(scope))
    assert seen == [KeyRing.key_id(k.encode()) for k in KEYS]
    assert KeyRing(["other"]).match(scope) is None  # a ring that never had its key


def test_the_session_given_at_minting_starts_each_socket(keyed: TestClient[Any], keyed_state: AppState) -> None:
    session = {"type": "transcription", "include": ["item.input_audio_transcription.tentative"],
               "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None,
                                   "transcription": {"language": "en", "prompt": "Dashwood"}}}}
    minted = _mint(keyed, session=session, expires_after={"anchor": "created_at", "seconds": 30})
    with keyed.websocket_connect(RT, headers=ga(minted["value"])) as ws:
        created = ws.receive_json(timeout=30)
        audio_in = created["session"]["audio"]["input"]
        assert audio_in["format"]["rate"] == 16000 and audio_in["turn_detection"] is None
        assert audio_in["transcription"]["language"] == "en" and audio_in["transcription"]["prompt"] == "Dashwood"
        assert created["session"]["include"] == ["item.input_audio_transcription.tentative"]
        (live,) = [s for s in keyed_state.speech.sessions.values() if not s.closed]  # type: ignore[union-attr]
        assert not live.options.vad and live.options.prompt == "Dashwood" and live.options.language == "en"
        # and the client may still change it, as after any update
        ws.send_text(json.dumps({"type": "session.update", "session": {
            "type": "transcription", "audio": {"input": {"transcription": {"prompt": "Marianne"}}}}}))
        assert ws.receive_json(timeout=30)["session"]["audio"]["input"]["transcription"]["prompt"] == "Marianne"
    # the beta route's session, on a beta socket
    beta_minted = keyed.post("/v1/realtime/transcription_sessions", headers={"x-api-key": KEYS[0]},
                             json={"input_audio_transcription": {"prompt": "Elinor"}, "turn_detection": None}).json()
    with keyed.websocket_connect(RT, headers=beta(beta_minted["client_secret"]["value"])) as ws:
        created = ws.receive_json(timeout=30)
    assert created["type"] == "transcription_session.created"
    assert created["session"]["input_audio_transcription"]["prompt"] == "Elinor"
    assert created["session"]["turn_detection"] is None


def test_without_keys_minting_works_the_same_and_the_secret_is_accepted(keyless: TestClient[Any]) -> None:
    minted = _mint(keyless, None, session={"type": "transcription",
                                           "audio": {"input": {"transcription": {"prompt": "Willoughby"}}}})
    with keyless.websocket_connect(RT, headers=ga(minted["value"])) as ws:
        assert ws.accepted_subprotocol == "realtime"
        created = ws.receive_json(timeout=30)
    assert created["session"]["audio"]["input"]["transcription"]["prompt"] == "Willoughby"
