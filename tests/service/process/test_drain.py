"""Draining on SIGTERM with the real engine: admission stops at once, streams that finish in time finish
normally, the rest end with an error event (code shutting_down) and [DONE]; a live socket sends the text of the
audio it received, then an error event (shutting_down) and closes with 1001."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from litestar.exceptions import WebSocketDisconnect
from litestar.testing import TestClient

from engine.runtime import Engine
from service.app import create_app
from service.config import ServiceConfig
from service.process.drain import drain
from service.speech.setup import SpeechConfig, install_speech
from service.state import AppState
from tests.fixtures.tiny_whisper import build_tiny_whisper
from tests.service.asgi import ASGIClient, asgi_scope
from tests.service.speech.test_live_socket import BETA, append, manual_turns, until, voiced
from tests.service.speech.test_routes import wav_bytes

pytestmark = pytest.mark.anyio
USER = [{"role": "user", "content": "Hello there"}]


@pytest.fixture
def no_eos(tiny_loaded: Any) -> dict[str, int]:
    return {str(tiny_loaded.tokenizer.eos_token_id): -100}


async def _drain_during_stream(tiny_loaded: Any, timeout: float, body: dict[str, Any]) -> tuple[AppState, ASGIClient]:
    engine = Engine(tiny_loaded, max_active=4)
    state = AppState(engine=engine, ready=True, config=ServiceConfig(shutdown_timeout=timeout))
    app = create_app(state)
    client = ASGIClient({"messages": USER, "stream": True, **body})
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        tg.start_soon(app, asgi_scope("/v1/chat/completions"), client.receive, client.send)
        await client.first.wait()
        await drain(state)
        await client.leave.wait()
        engine.close()
    return state, client


async def test_streams_past_the_timeout_end_with_an_error_event_and_done(tiny_loaded: Any,
                                                                         no_eos: dict[str, int]) -> None:
    state, client = await _drain_during_stream(tiny_loaded, 0.1, {"max_tokens": 1900, "logit_bias": no_eos})
    events = client.events()
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "shutting_down"
    assert state.draining and state.inflight.count == 0


async def test_streams_that_finish_in_time_finish_normally(tiny_loaded: Any, no_eos: dict[str, int]) -> None:
    _, client = await _drain_during_stream(tiny_loaded, 60, {"max_tokens": 24, "logit_bias": no_eos})
    events = client.events()
    assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1])
    assert [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"]][-1] == "length"


@pytest.mark.parametrize("hurried_before_the_drain", [False, True])
async def test_a_second_interrupt_ends_streams_with_their_final_events_at_once(
        tiny_loaded: Any, no_eos: dict[str, int], hurried_before_the_drain: bool) -> None:
    # The second Ctrl-C killed the worker: open streams were cut with no error event and no [DONE]. Now the worker is
    # told (drain.HURRY_SIGNAL) and ends them as the deadline does, before the supervisor's kill.
    engine = Engine(tiny_loaded, max_active=4)
    state = AppState(engine=engine, ready=True, config=ServiceConfig(shutdown_timeout=600))
    app = create_app(state)
    client = ASGIClient({"messages": USER, "stream": True, "max_tokens": 1900, "logit_bias": no_eos})
    hurry = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        tg.start_soon(app, asgi_scope("/v1/chat/completions"), client.receive, client.send)
        await client.first.wait()
        if hurried_before_the_drain:  # the supervisor's signal came first: the worker drains at once
            hurry.set()
        with anyio.fail_after(120):  # far under the 600 s grace: only the hurry ends the wait
            async with anyio.create_task_group() as draining:
                draining.start_soon(drain, state, hurry)
                if not hurry.is_set():
                    await anyio.wait_all_tasks_blocked()  # the drain waits for the stream, 600 s at most
                    assert state.draining and state.inflight.count == 1
                    hurry.set()
            await client.leave.wait()
        engine.close()
    events = client.events()
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "shutting_down"
    assert state.inflight.count == 0


def test_while_draining_new_requests_get_503_and_health_says_stopping(tiny_loaded: Any) -> None:
    state = AppState(engine=Engine(tiny_loaded, max_active=4))
    with TestClient(create_app(state)) as client:
        state.draining = True
        refused = client.post("/v1/chat/completions", json={"messages": USER})
        assert refused.status_code == 503 and refused.headers["retry-after"]
        assert refused.json()["error"]["code"] == "shutting_down"
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "stopping"


async def test_queued_requests_are_refused_when_the_drain_starts() -> None:
    # Queued (not running) requests waited the whole grace period for the 503 they were always going to get.
    from tests.service.fake_engine import FakeEngine

    class Queueing(FakeEngine):
        refused = 0

        def refuse_queued(self) -> int:
            self.refused += 1
            return 2

    engine = Queueing()
    state = AppState(engine=engine, ready=True, config=ServiceConfig(shutdown_timeout=60))
    state.inflight.enter()  # a running stream: it keeps its grace period
    async with anyio.create_task_group() as tg:
        tg.start_soon(drain, state)
        await anyio.wait_all_tasks_blocked()
        assert engine.refused == 1 and state.inflight.count == 1
        state.inflight.exit()


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_whisper(tmp_path_factory.mktemp("tiny_whisper"))


def _speech_app(whisper_dir: Path) -> tuple[AppState, TestClient[Any]]:
    config = ServiceConfig(shutdown_timeout=60)  # ample: the socket ends as soon as its text is out
    state = install_speech(AppState(config=config), SpeechConfig(model=str(whisper_dir), resident=True))
    return state, TestClient(create_app(state))


def test_a_realtime_session_sends_the_text_of_its_audio_then_shutting_down_and_1001(whisper_dir: Path) -> None:
    # The socket was cut with no close frame and the audio already sent was never transcribed.
    state, client = _speech_app(whisper_dir)
    with client, client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        ws.receive_json(timeout=30)
        append(ws, voiced(1.0))  # speech with no pause after it: only the drain ends the utterance
        ws.send_text(json.dumps({"type": "transcription_session.update", "session": {}}))
        until(ws, "transcription_session.updated")  # handled after the append: the audio is in the session
        client.blocking_portal.call(drain, state)
        events = until(ws, "error")
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json(timeout=30)
    kinds = [e["type"] for e in events]
    assert "input_audio_buffer.committed" in kinds
    done = events[kinds.index("conversation.item.input_audio_transcription.completed")]
    assert done["usage"]["seconds"] > 0.5  # the received speech was transcribed
    assert events[-1]["error"]["code"] == "shutting_down" and closed.value.code == 1001
    assert state.inflight.count == 0


def test_a_binary_frame_session_sends_its_transcript_then_shutting_down_and_1001(whisper_dir: Path) -> None:
    state, client = _speech_app(whisper_dir)
    with client, client.websocket_connect("/v1/audio/live?rate=16000&encoding=f32le&interval=0") as ws:
        ws.receive_json(timeout=30)
        ws.send_bytes(voiced(1.0, 16000).astype("<f4").tobytes())
        ws.send_text('{"type": "bogus"}')
        until(ws, "error")  # answered after the frame was taken
        client.blocking_portal.call(drain, state)
        done = until(ws, "transcript.done")[-1]
        error = until(ws, "error")[-1]
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json(timeout=30)
    assert done["received_seconds"] == pytest.approx(1.0)
    assert error["code"] == "shutting_down" and closed.value.code == 1001


@pytest.mark.parametrize("stream", [False, True])
def test_a_file_transcription_past_the_timeout_ends_with_shutting_down(whisper_dir: Path, stream: bool,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Its windows ran on past the timeout (a long file to its end, or until granian killed the worker: a reset).
    state = install_speech(AppState(config=ServiceConfig(shutdown_timeout=0.1)),
                           SpeechConfig(model=str(whisper_dir), resident=True))
    answers: list[Any] = []
    with TestClient(create_app(state)) as client:
        entered, _ = _held_steps(state, monkeypatch)  # the file's first step, held until the speech service stops
        post = threading.Thread(target=lambda: answers.append(client.post(
            "/v1/audio/transcriptions", files={"file": ("a.wav", wav_bytes(voiced(3.0, 16000)), "audio/wav")},
            data={"model": str(whisper_dir), "vad": "false", "stream": str(stream).lower()})))
        post.start()
        assert entered.wait(60)
        client.blocking_portal.call(drain, state)
        post.join()
    answer = answers[0]
    if stream:
        assert answer.status_code == 200 and answer.text.rstrip().endswith("}")
        error = json.loads(answer.text.strip().splitlines()[-1].removeprefix("data: "))["error"]
    else:
        assert answer.status_code == 503 and answer.headers["retry-after"]
        error = answer.json()["error"]
    assert error["code"] == "shutting_down" and error["type"] == "server_error"
    assert state.inflight.count == 0


def _held_steps(state: AppState, monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Whisper steps held on the speech thread until `release` is set, which stopping the speech service does:
    (entered, release). Raises nothing."""
    entered, release = threading.Event(), threading.Event()
    scheduler = state.speech.scheduler  # type: ignore[union-attr]  # the SpeechService in-process
    step, stop = scheduler._step, scheduler.stop

    def held() -> str:
        entered.set()
        assert release.wait(60), "the steps were never released"
        return step()

    def stopping(why: str) -> None:
        stop(why)
        release.set()

    monkeypatch.setattr(scheduler, "_step", held)
    monkeypatch.setattr(scheduler, "stop", stopping)
    return entered, release


def test_a_committed_item_whose_text_cannot_come_in_time_gets_failed_before_the_close(
        whisper_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Items that got committed and conversation.item.created got nothing more before the close.
    state = install_speech(AppState(config=ServiceConfig(shutdown_timeout=0.1)),
                           SpeechConfig(model=str(whisper_dir), resident=True))
    with TestClient(create_app(state)) as client, \
            client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        entered, _ = _held_steps(state, monkeypatch)
        manual_turns(ws)
        append(ws, voiced(1.0))
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit"}))
        item = until(ws, "conversation.item.created")[-1]["item"]["id"]
        assert entered.wait(60)  # its decode is held: its text cannot come within the timeout
        client.blocking_portal.call(drain, state)
        events = until(ws, "error")
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json(timeout=30)
    failed = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.failed"]
    assert [(e["item_id"], e["content_index"], e["error"]["code"]) for e in failed] == [(item, 0, "shutting_down")]
    assert failed[0]["error"]["type"] == "server_error" and failed[0]["error"]["message"]
    assert not any(e["type"].endswith(".completed") for e in events)
    assert events[-1]["error"]["code"] == "shutting_down" and closed.value.code == 1001


def test_what_a_draining_socket_is_sent_gets_no_error_of_its_own(whisper_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # One shutting_down error per append came (49 of them) before the one before the close.
    from audio.sessions import LiveSession
    from service.speech.live_socket import LiveSocket

    finishing, read = threading.Event(), threading.Event()
    sent, reads = 4, 0
    finish, init = LiveSession.finish, LiveSocket.__init__

    async def finishes(self: LiveSession) -> Any:  # the socket's drain began: it takes nothing more
        finishing.set()
        return await finish(self)

    def counted(self: LiveSocket, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        receive = self.socket.receive

        async def receiving() -> Any:  # asked again once the message before is handled
            nonlocal reads
            if finishing.is_set():
                reads += 1
                if reads > sent:
                    read.set()
            return await receive()

        self.socket.receive = receiving  # type: ignore[method-assign]  # counts the reads

    monkeypatch.setattr(LiveSession, "finish", finishes)
    monkeypatch.setattr(LiveSocket, "__init__", counted)
    state, client = _speech_app(whisper_dir)
    with client, client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        entered, release = _held_steps(state, monkeypatch)
        ws.receive_json(timeout=30)
        append(ws, voiced(1.0))
        assert entered.wait(60)
        client.blocking_portal.start_task_soon(drain, state)
        assert finishing.wait(60)
        for _ in range(sent - 1):
            append(ws, voiced(0.1))
        ws.send_text(json.dumps({"type": "transcription_session.update", "session": {}}))
        ws.send_text("{}")  # the read after the last one counted
        assert read.wait(60)  # every message sent while draining was handled
        release.set()  # the session's text comes within the timeout
        events = until(ws, "error")
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json(timeout=30)
    kinds = [e["type"] for e in events]
    assert kinds.count("error") == 1 and events[-1]["error"]["code"] == "shutting_down" and closed.value.code == 1001
    assert "conversation.item.input_audio_transcription.completed" in kinds
    assert "transcription_session.updated" not in kinds
