"""A CTranslate2 (faster-whisper) folder is served under its folder's name, as an mlx-whisper folder is: not as
its import in the user cache (`<folder>-<dtype>`, which changed with the machine's dtype and made a request that
names the folder a 404)."""

from __future__ import annotations

from pathlib import Path

import pytest
from litestar.testing import TestClient

from service.app import create_app
from service.speech.setup import SpeechConfig, install_speech
from service.state import AppState
from tests.audio.test_whisper_imports import _write_ct2
from tests.service.fake_engine import FakeEngine
from tests.service.speech.test_routes import voiced, wav_bytes, whisper_dir  # noqa: F401 (a fixture)


def test_a_ctranslate2_folder_is_served_and_asked_for_by_its_name(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    folder = _write_ct2(tmp_path / "ct2-tiny-en-f16", seed=1)
    state = install_speech(AppState(), SpeechConfig(model=str(folder), resident=True))
    with TestClient(create_app(state)) as client:
        cards = client.get("/v1/models").json()["data"]
        assert [c["id"] for c in cards if c.get("kind") == "transcription"] == ["ct2-tiny-en-f16"]
        for model in ("ct2-tiny-en-f16", "whisper-1", str(folder)):
            r = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav_bytes(voiced(1.0)), "audio/wav")},
                            data={"model": model, "temperature": "1.0", "response_format": "json"})
            assert r.status_code == 200, (model, r.text)


def test_a_model_named_on_the_other_kind_of_route_is_called_what_it_is(whisper_dir: Path) -> None:
    # Chat UIs list every /v1/models id: Whisper offered for chat got "does not exist or is not served here
    # (served: ..., whisper-...)", naming it as served in the same breath.
    state = install_speech(AppState(engine=FakeEngine()), SpeechConfig(model=str(whisper_dir), resident=True))
    with TestClient(create_app(state)) as client:
        for model in (whisper_dir.name, "whisper-1"):
            r = client.post("/v1/chat/completions", json={"model": model, "messages": [
                {"role": "user", "content": "hi"}]})
            error = r.json()["error"]
            assert r.status_code == 404 and (error["code"], error["param"]) == ("model_not_found", "model")
            assert "speech-to-text model" in error["message"] and "serves `fake-model`" in error["message"], error
        r = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav_bytes(voiced(1.0)), "audio/wav")},
                        data={"model": "fake-model"})
        error = r.json()["error"]
        assert r.status_code == 404 and "is a chat model" in error["message"] and whisper_dir.name in error["message"]
        other = client.post("/v1/chat/completions", json={"model": "gpt-9", "messages": [
            {"role": "user", "content": "hi"}]}).json()["error"]
        assert other["message"].startswith("The model `gpt-9` does not exist")
