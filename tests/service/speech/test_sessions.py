"""service/speech/sessions.py and the live sockets with API keys: one key holds at most its share of
--max-sessions (--key-session-share) while other keys still get in; a single key, or none, is never capped."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
from litestar.exceptions import WebSocketDisconnect
from litestar.testing import TestClient

from service.app import create_app
from service.config import ServiceConfig
from service.speech.setup import SpeechConfig, install_speech, key_session_cap
from service.state import AppState
from tests.fixtures.tiny_whisper import build_tiny_whisper

RT = "/v1/realtime?intent=transcription"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_whisper(tmp_path_factory.mktemp("tiny_whisper"))


def _client(whisper_dir: Path, keys: list[str], **speech: Any) -> TestClient[Any]:
    state = install_speech(AppState(config=ServiceConfig(api_keys=keys)),
                           SpeechConfig(model=str(whisper_dir), resident=True, max_sessions=4, **speech))
    return TestClient(create_app(state))


@pytest.fixture
def two_keys(whisper_dir: Path) -> Iterator[TestClient[Any]]:
    with _client(whisper_dir, ["alpha", "beta"]) as c:
        yield c


def test_one_key_holds_at_most_its_share_while_another_still_gets_in(two_keys: TestClient[Any]) -> None:
    # One client could take every place: the other key's dictation was refused for as long as it held them.
    for _ in range(2):  # half of 4 by default
        assert two_keys.post("/v1/audio/sessions", json={}, headers=bearer("alpha")).status_code == 200
    r = two_keys.post("/v1/audio/sessions", json={}, headers=bearer("alpha"))
    assert r.status_code == 429 and r.json()["error"]["code"] == "session_share_reached"
    assert "--key-session-share" in r.json()["error"]["message"] and int(r.headers["retry-after"]) >= 1
    with two_keys.websocket_connect(RT, headers=bearer("alpha")) as ws:  # a socket counts the same
        event = ws.receive_json(timeout=30)
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json(timeout=30)
    assert event["error"]["code"] == "session_share_reached" and closed.value.code == 1013
    with two_keys.websocket_connect(RT, headers=bearer("beta")) as ws:
        assert ws.receive_json(timeout=30)["type"] == "session.created"
        created = two_keys.post("/v1/audio/sessions", json={}, headers=bearer("beta"))
        assert created.status_code == 200
        assert two_keys.delete(f"/v1/audio/sessions/{created.json()['id']}", headers=bearer("beta")).status_code == 200
    assert two_keys.get("/stats", headers=bearer("beta")).json()["speech"]["max_sessions_per_key"] == 2


def test_a_single_key_is_not_capped(whisper_dir: Path) -> None:
    with _client(whisper_dir, ["alpha"]) as c:
        for _ in range(4):
            assert c.post("/v1/audio/sessions", json={}, headers=bearer("alpha")).status_code == 200
        assert c.post("/v1/audio/sessions", json={}, headers=bearer("alpha")).json()["error"]["code"] == \
            "session_unavailable"


@pytest.mark.parametrize("keys, share, cap", [(0, 0.5, None), (1, 0.5, None), (2, 0.5, 32), (3, 0.25, 16),
                                              (2, 1.0, None), (2, 0.001, 1)])
def test_the_cap_per_key(keys: int, share: float, cap: int | None) -> None:
    assert key_session_cap(SpeechConfig(max_sessions=64, key_session_share=share), keys) == cap
