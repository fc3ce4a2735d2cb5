"""A streamed transcription sends `: keep-alive` every --sse-keepalive seconds while a window decodes (a proxy's idle
timer cut 55 s files between deltas), and stops the decode at once when its client leaves."""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncGenerator, Iterator

import anyio
import numpy as np
import pytest
from litestar.testing import TestClient

from audio.speech import SpeechService
from audio.transcript import Segment, TranscribeOptions, Transcript
from service.app import create_app
from service.config import ServiceConfig
from service.speech.setup import SpeechConfig, install_speech
from service.state import AppState
from tests.service.conftest import sse_events
from tests.service.speech.test_routes import transcribe, whisper_dir  # noqa: F401 (a fixture)

SLOW_WINDOW_S = 1.0  # the fake decode's second window: a hundred keep-alive intervals


@pytest.fixture
def slow(monkeypatch: pytest.MonkeyPatch) -> None:
    async def stream(self: SpeechService, pcm: np.ndarray,
                     options: TranscribeOptions) -> AsyncGenerator[list[Segment] | Transcript, None]:
        first = Segment(0, 0, 0.0, 1.0, " One.")
        yield [first]
        await anyio.sleep(SLOW_WINDOW_S)  # stands for a long Whisper window, not a wait for something
        second = Segment(1, 100, 1.0, 2.0, " Two.")
        yield [second]
        yield Transcript(" One. Two.", "en", 2.0, segments=[first, second])

    monkeypatch.setattr(SpeechService, "transcribe_stream", stream)


def _client(whisper_dir: Path, keepalive: float) -> TestClient[Any]:
    state = install_speech(AppState(config=ServiceConfig(sse_keepalive=keepalive)),
                           SpeechConfig(model=str(whisper_dir), resident=True))
    return TestClient(create_app(state))


@pytest.fixture
def client(whisper_dir: Path) -> Iterator[TestClient[Any]]:  # noqa: F811
    with _client(whisper_dir, 0.01) as c:
        yield c


def test_a_quiet_window_gets_keep_alives(client: TestClient[Any], slow: None) -> None:
    r = transcribe(client, stream="true")
    assert r.status_code == 200
    events = sse_events(r.text)
    assert [e["type"] for e in events] == ["transcript.text.delta"] * 2 + ["transcript.text.done"]
    assert events[-1]["text"] == "One. Two."
    between = r.text.split("data: ")[1]  # the first delta and what went out before the second
    assert ": keep-alive" in between


def test_without_keep_alives_none_are_sent(whisper_dir: Path, slow: None) -> None:  # noqa: F811
    with _client(whisper_dir, 0) as c:
        r = transcribe(c, stream="true")
    assert r.status_code == 200 and ": keep-alive" not in r.text and "One. Two." in r.text


def test_an_engine_process_dying_mid_stream_ends_it_with_an_error_event_and_logs_why(
        client: TestClient[Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # --isolate, the engine process killed mid-file: the client got the error event, the server's log nothing.
    from engine.errors import EngineRestarting

    async def stream(self: SpeechService, pcm: np.ndarray,
                     options: TranscribeOptions) -> AsyncGenerator[list[Segment] | Transcript, None]:
        yield [Segment(0, 0, 0.0, 1.0, " One.")]
        raise EngineRestarting("The engine process exited (status -9); it is restarting.", retry_after=10)

    monkeypatch.setattr(SpeechService, "transcribe_stream", stream)
    with caplog.at_level("WARNING"):
        r = transcribe(client, stream="true")
    events = sse_events(r.text)
    assert events[0]["delta"] == "One." and events[-1]["error"]["code"] == "engine_restarting", events
    assert len([x for x in caplog.records if "exited (status -9)" in x.getMessage()]) == 1, caplog.records
