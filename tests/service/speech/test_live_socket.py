"""The live websockets over a tiny random-init Whisper: OpenAI's Realtime transcription grammar on /v1/realtime
and /v1/audio/live, session updates honoured or refused naming the field, bad frames answered with error
events while the audio is kept, the binary-frame mode, caps as error events, sessions gone with their
socket, and silent sockets giving their place up after the session TTL."""

from __future__ import annotations

import base64
import contextlib
import json
from pathlib import Path
from typing import Any, Iterator, cast

import anyio
import numpy as np
import pytest
from litestar.exceptions import WebSocketDisconnect
from litestar.testing import TestClient
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from audio.live import LiveConfig
from audio.pcm import PcmFormat, PcmStream, resample
from engine.errors import EngineRestarting
from service.app import create_app
from service.speech.realtime_config import EAGERNESS_SILENCE_MS
from service.speech.setup import SpeechConfig, install_speech
from service.state import AppState
from tests.fixtures.g711 import encode_g711
from tests.fixtures.tiny_whisper import build_tiny_whisper

SR = 24000  # what Realtime clients send
BETA = {"OpenAI-Beta": "realtime=v1"}


def voiced(seconds: float, rate: int = SR) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (((t * 150) % 1.0 - 0.5) * 0.5 * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)


def pcm16(x: np.ndarray) -> bytes:
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


def append(ws: Any, x: np.ndarray) -> None:
    ws.send_text(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm16(x)).decode()}))


def until(ws: Any, kind: str, limit: int = 400) -> list[dict[str, Any]]:
    """Events up to and including the first of type `kind`."""
    seen = []
    for _ in range(limit):
        event = ws.receive_json(timeout=120)
        seen.append(event)
        if event["type"] == kind:
            return seen
    raise AssertionError(f"no {kind} in {[e['type'] for e in seen]}")


def manual_turns(ws: Any) -> None:
    """After the session's creation: server VAD off, so only the client's commits end an item."""
    ws.receive_json(timeout=30)
    ws.send_text(json.dumps({"type": "transcription_session.update", "session": {"turn_detection": None}}))
    until(ws, "transcription_session.updated")


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_whisper(tmp_path_factory.mktemp("tiny_whisper"))


@pytest.fixture(scope="module")
def state(whisper_dir: Path) -> AppState:
    return install_speech(AppState(), SpeechConfig(model=str(whisper_dir), resident=True, max_sessions=3))


@pytest.fixture(scope="module")
def client(state: AppState) -> Iterator[TestClient[Any]]:
    with TestClient(create_app(state)) as c:
        yield c


def test_realtime_needs_the_transcription_intent(client: TestClient[Any]) -> None:
    with client.websocket_connect("/v1/realtime") as ws:
        event = ws.receive_json(timeout=30)
    assert event["type"] == "error" and event["error"]["param"] == "intent"


def test_a_realtime_refusal_before_the_session_is_openais_error_event(client: TestClient[Any]) -> None:
    with client.websocket_connect("/v1/realtime?intent=transcription&model=gpt-4o-transcribe-diarize") as ws:
        event = ws.receive_json(timeout=30)
    assert set(event) == {"type", "event_id", "error"}, event  # no flat copy of the error beside it
    assert set(event["error"]) == {"type", "code", "message", "param", "event_id"}
    assert (event["error"]["code"], event["error"]["param"]) == ("model_not_found", "model")


@pytest.mark.parametrize("path, param", [("/v1/realtime?intent=transcription&modle=whisper-1", "modle"),
                                         ("/v1/audio/live?rate=48000&encodng=s16le", "encodng")])
def test_a_query_parameter_the_socket_does_not_read_is_refused_by_name(client: TestClient[Any], path: str,
                                                                       param: str) -> None:
    with client.websocket_connect(path) as ws:
        event = ws.receive_json(timeout=30)
    assert event["type"] == "error" and event["error"]["param"] == param
    assert event["error"]["code"] == "unknown_parameter"


@pytest.mark.parametrize("path", ["/v1/realtime?intent=transcription&api-version=2024-10-01-preview",
                                  "/v1/audio/live?rate=16000&api-version=2024-10-01-preview"])
def test_azures_api_version_is_taken_by_the_sockets(client: TestClient[Any], path: str) -> None:
    # AzureOpenAI adds it to every request, a socket's too (service/http/query.py): it was refused by name.
    with client.websocket_connect(path, headers=BETA) as ws:
        created = ws.receive_json(timeout=30)
    assert created["type"] in ("transcription_session.created", "session.created"), created


def test_a_beta_session_is_created_and_updated(client: TestClient[Any], whisper_dir: Path) -> None:
    with client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        created = ws.receive_json(timeout=30)
        assert created["type"] == "transcription_session.created" and created["event_id"]
        session = created["session"]
        assert session["input_audio_format"] == "pcm16" and session["turn_detection"]["type"] == "server_vad"
        ws.send_text(json.dumps({"type": "transcription_session.update", "event_id": "c1", "session": {
            "input_audio_format": "pcm16",
            "input_audio_transcription": {"model": "whisper-1", "language": "en", "prompt": "Dashwood"},
            "turn_detection": {"type": "server_vad", "threshold": 0.8, "prefix_padding_ms": 250,
                               "silence_duration_ms": 700}}}))
        updated = ws.receive_json(timeout=30)
    assert updated["type"] == "transcription_session.updated"
    s = updated["session"]
    assert s["input_audio_transcription"] == {"model": "whisper-1", "language": "en", "prompt": "Dashwood"}
    assert s["turn_detection"] == {"type": "server_vad", "threshold": 0.8, "prefix_padding_ms": 250,
                                   "silence_duration_ms": 700}


def test_openai_transcription_model_ids_open_and_update_a_session(client: TestClient[Any]) -> None:
    # Pipecat's realtime STT names gpt-realtime-whisper, LiveKit's gpt-4o-mini-transcribe
    with client.websocket_connect("/v1/realtime?model=gpt-realtime-whisper") as ws:
        created = ws.receive_json(timeout=30)
        assert created["type"] == "session.created"
        assert created["session"]["audio"]["input"]["turn_detection"] is None  # a realtime-only model: none
        ws.send_text(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "transcription": {"model": "gpt-4o-mini-transcribe"}}}}}))
        updated = ws.receive_json(timeout=30)
    assert updated["type"] == "session.updated", updated
    assert updated["session"]["audio"]["input"]["transcription"]["model"] == "gpt-4o-mini-transcribe"
    # the client never set it: the default follows the model, and this one has server VAD
    assert updated["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"


@pytest.mark.parametrize("model", ["gpt-live-transcribe", "whisper-1"])
def test_completed_names_the_language_heard_for_gpt_live_transcribe(client: TestClient[Any], model: str) -> None:
    """openai-python's ConversationItemInputAudioTranscriptionCompletedEvent.languages ("Returned by gpt-transcribe"),
    which LiveKit's stt.py reads over the language it asked for; other models' events keep OpenAI's shape."""
    with client.websocket_connect(f"/v1/realtime?intent=transcription&model={model}") as ws:
        ws.receive_json(timeout=30)
        append(ws, voiced(1.0))
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit"}))
        done = until(ws, "conversation.item.input_audio_transcription.completed")[-1]
    if model == "whisper-1":
        assert "languages" not in done
    else:  # the served tiny Whisper is English-only
        assert done["languages"] == ([{"code": "en"}] if done["transcript"] else []), done


@pytest.mark.parametrize("dialect", ["ga", "beta"])
def test_a_realtime_only_model_has_no_server_vad_and_the_clients_commit_makes_the_one_item(
        client: TestClient[Any], state: AppState, dialect: str) -> None:
    """LiveKit Agents (livekit-plugins-openai stt.py) leaves turn_detection out for gpt-realtime-whisper and
    gpt-live-transcribe, which "reject turn_detection and emit no speech_started/stopped, so the client commits the
    buffer to close a segment": with server VAD left on, the server committed the speech itself and the client's
    commit then made a second, empty item (or, within 100 ms, input_audio_buffer_commit_empty: fatal to LiveKit)."""
    if dialect == "ga":  # LiveKit's event, byte for byte, on the URL it opens off api.openai.com
        path, headers, reply = "/v1/realtime?intent=transcription&model=gpt-realtime-whisper", {}, "session.updated"
        update = {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "format": {"rate": 24000, "type": "audio/pcm"},
            "transcription": {"language": "en", "model": "gpt-realtime-whisper"}}}}}
    else:
        path, headers, reply = "/v1/realtime?intent=transcription", BETA, "transcription_session.updated"
        update = {"type": "transcription_session.update", "session": {
            "input_audio_format": "pcm16", "input_audio_transcription": {"language": "en",
                                                                         "model": "gpt-live-transcribe"}}}
    with client.websocket_connect(path, headers=headers) as ws:
        ws.receive_json(timeout=30)
        ws.send_text(json.dumps(update))
        updated = until(ws, reply)[-1]["session"]
        shown = updated["turn_detection"] if dialect == "beta" else updated["audio"]["input"]["turn_detection"]
        assert shown is None, shown
        (session,) = [s for s in state.speech.sessions.values() if not s.closed]  # type: ignore[union-attr]
        assert not session.options.vad
        silence = np.zeros(int(0.5 * SR), np.float32)
        for chunk in np.array_split(np.concatenate([silence, voiced(1.5), silence, silence, silence]), 10):
            append(ws, chunk)  # a pause server VAD would have ended the speech at
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit", "event_id": "lk"}))
        events = until(ws, "conversation.item.input_audio_transcription.completed")
    kinds = [e["type"] for e in events]
    assert "input_audio_buffer.speech_started" not in kinds and "error" not in kinds, kinds
    (committed,) = [e for e in events if e["type"] == "input_audio_buffer.committed"]
    assert committed["client_event_id"] == "lk"  # the client's commit made the item
    if dialect == "ga":  # OpenAI's GA events: async-openai's GA RealtimeServerEvent has no conversation.item.created
        at = kinds.index("input_audio_buffer.committed")
        assert kinds[at + 1: at + 3] == ["conversation.item.added", "conversation.item.done"], kinds
        assert "conversation.item.created" not in kinds
        assert events[at + 1]["item"] == events[at + 2]["item"] and events[at + 1]["item"]["id"] == committed["item_id"]
        realtime_events = TypeAdapter(RealtimeServerEvent)  # openai-python's GA union
        assert [type(realtime_events.validate_python(e)).__name__ for e in events[at + 1: at + 3]] == \
            ["ConversationItemAdded", "ConversationItemDone"]
    else:
        assert kinds.count("conversation.item.created") == 1 and "conversation.item.added" not in kinds
    assert events[-1]["usage"]["seconds"] == pytest.approx(3.5, abs=0.05)  # all the audio, in the one item


def test_a_ga_session_declares_its_rate(client: TestClient[Any], state: AppState) -> None:
    with client.websocket_connect("/v1/realtime?intent=transcription") as ws:
        assert ws.receive_json(timeout=30)["type"] == "session.created"
        ws.send_text(json.dumps({"type": "session.update", "session": {
            "type": "transcription", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000},
                                                         "turn_detection": None,
                                                         "transcription": {"keywords": ["Marianne"]}}}}}))
        updated = ws.receive_json(timeout=30)
        assert updated["type"] == "session.updated"
        audio_in = updated["session"]["audio"]["input"]
        assert audio_in["format"] == {"type": "audio/pcm", "rate": 16000} and audio_in["turn_detection"] is None
        assert audio_in["transcription"]["keywords"] == ["Marianne"]
        (session,) = [s for s in state.speech.sessions.values() if not s.closed]  # type: ignore[union-attr]
        assert not session.options.vad and session.options.prompt == "Marianne"
        append(ws, voiced(0.5, 16000))  # 16 kHz as declared
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit"}))
        until(ws, "input_audio_buffer.committed")
        assert session.received_seconds == pytest.approx(0.5, abs=0.03)


def test_g711_is_decoded_and_echoed_and_a_format_change_mid_session_is_taken(
        client: TestClient[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A telephony client (Twilio's media streams: base64 μ-law at 8 kHz, any byte count) after some PCM16: the
    PCM that reaches the session is the G.711 decode, resampled from 8 kHz as other rates are."""
    from audio.sessions import LiveSession

    taken: list[np.ndarray] = []
    take = LiveSession._take
    monkeypatch.setattr(LiveSession, "_take", lambda self, pcm: (taken.append(np.array(pcm)), take(self, pcm)))
    speech = voiced(1.0, 8000)
    ulaw = encode_g711(speech, "ulaw")
    with client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        manual_turns(ws)
        append(ws, voiced(0.5))  # PCM16 at 24 kHz first: its resampler's tail goes before the change
        ws.send_text(json.dumps({"type": "transcription_session.update", "session": {
            "input_audio_format": "g711_ulaw"}}))
        assert until(ws, "transcription_session.updated")[-1]["session"]["input_audio_format"] == "g711_ulaw"
        before = len(taken)
        for i in range(0, len(ulaw), 1601):  # odd byte counts: one byte a sample
            ws.send_text(json.dumps({"type": "input_audio_buffer.append",
                                     "audio": base64.b64encode(ulaw[i:i + 1601]).decode()}))
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit"}))
        done = until(ws, "conversation.item.input_audio_transcription.completed")[-1]
    assert done["usage"]["seconds"] == pytest.approx(1.5, abs=0.002)
    tail, *chunks = taken[before:]  # the change flushed the 24 kHz resampler's held-back tail first
    assert 0 < len(tail) < 400
    got = np.concatenate(chunks)
    stream = PcmStream(PcmFormat(8000, "ulaw"))
    want = np.concatenate([stream.push(ulaw[i:i + 1601]) for i in range(0, len(ulaw), 1601)] + [stream.flush()])
    np.testing.assert_array_equal(got, want)
    expected = resample(speech, 8000)  # and that is the speech sent, within G.711's steps
    np.testing.assert_allclose(got[200:-200], expected[200:len(got) - 200], atol=0.02)


@pytest.mark.parametrize("model", ["gpt-4o-transcribe", "gpt-4o-mini-transcribe", "whisper-1"])
def test_a_transcripts_usage_is_openais_for_the_sessions_model(client: TestClient[Any], model: str) -> None:
    """OpenAI's `.completed` says tokens for gpt-4o-transcribe (as its file answers), seconds for whisper-1; ours was
    always seconds. Counted as a file's: the prompt's tokens, 50 a second of the item's audio, the text's tokens."""
    from mlx_whisper.tokenizer import get_tokenizer

    prompt = "Ten of clubs."
    with client.websocket_connect("/v1/realtime?intent=transcription") as ws:
        assert ws.receive_json(timeout=30)["type"] == "session.created"
        ws.send_text(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "transcription": {"model": model, "prompt": prompt}, "turn_detection": None}}}}))
        until(ws, "session.updated")
        append(ws, voiced(1.5))
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit"}))
        done = until(ws, "conversation.item.input_audio_transcription.completed")[-1]
    usage = TypeAdapter(RealtimeServerEvent).validate_python(done).usage  # type: ignore[union-attr]
    if model == "whisper-1":
        assert done["usage"] == {"type": "duration", "seconds": 1.5}
        return
    assert usage is not None and usage.type == "tokens" and usage.input_token_details is not None, done
    details = usage.input_token_details
    assert (details.text_tokens, details.audio_tokens) == (len(get_tokenizer(False).encode(" " + prompt)), 75)
    assert usage.input_tokens == details.text_tokens + details.audio_tokens  # type: ignore[operator]
    written = get_tokenizer(False).encode(" " + done["transcript"]) if done["transcript"] else []
    assert usage.output_tokens == len(written)
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


@pytest.mark.parametrize("law", ["ulaw", "alaw"])
def test_a_ga_session_takes_g711_and_echoes_it_as_openai_does(client: TestClient[Any], law: str) -> None:
    kind = {"ulaw": "audio/pcmu", "alaw": "audio/pcma"}[law]
    with client.websocket_connect("/v1/realtime?intent=transcription") as ws:
        assert ws.receive_json(timeout=30)["type"] == "session.created"
        ws.send_text(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "format": {"type": kind}, "turn_detection": None}}}}))
        assert until(ws, "session.updated")[-1]["session"]["audio"]["input"]["format"] == {"type": kind}
        ws.send_text(json.dumps({"type": "input_audio_buffer.append",
                                 "audio": base64.b64encode(encode_g711(voiced(0.75, 8000), law)).decode()}))
        ws.send_text(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 16000}}}}}))
        assert until(ws, "session.updated")[-1]["session"]["audio"]["input"]["format"] == {
            "type": "audio/pcm", "rate": 16000}
        append(ws, voiced(0.25, 16000))
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit"}))
        done = until(ws, "conversation.item.input_audio_transcription.completed")[-1]
    assert done["usage"]["seconds"] == pytest.approx(1.0, abs=0.002)


@pytest.mark.parametrize("audio_format, param", [
    ({"type": "audio/opus"}, "session.audio.input.format.type"),
    ({"type": "g711_ulaw"}, "session.audio.input.format.type"),  # the beta name in the GA shape
    ({"type": "audio/pcmu", "rate": 16000}, "session.audio.input.format.rate"),  # G.711 is 8 kHz
])
def test_a_ga_format_that_cannot_be_honoured_names_its_field(client: TestClient[Any],
                                                             audio_format: dict[str, Any], param: str) -> None:
    with client.websocket_connect("/v1/realtime?intent=transcription") as ws:
        ws.receive_json(timeout=30)
        ws.send_text(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "format": audio_format}}}}))
        error = until(ws, "error")[-1]["error"]
    assert error["param"] == param and error["message"]


@pytest.mark.parametrize("update, param", [
    ({"input_audio_format": "g722"}, "session.input_audio_format"),
    ({"input_audio_format": ["g711_ulaw"]}, "session.input_audio_format"),
    ({"turn_detection": {"type": "near_field_vad"}}, "session.turn_detection.type"),
    ({"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}, "session.turn_detection.eagerness"),
    ({"turn_detection": {"type": "semantic_vad", "silence_duration_ms": 700}},
     "session.turn_detection.silence_duration_ms"),
    ({"turn_detection": {"type": "server_vad", "eagerness": "low"}}, "session.turn_detection.eagerness"),
    ({"turn_detection": {"type": "server_vad", "threshold": 1.5}}, "session.turn_detection.threshold"),
    ({"turn_detection": {"silence_duration_ms": 5}}, "session.turn_detection.silence_duration_ms"),
    ({"turn_detection": {"create_response": True}}, "session.turn_detection.create_response"),
    ({"input_audio_noise_reduction": {"type": "studio"}}, "session.input_audio_noise_reduction.type"),
    ({"input_audio_noise_reduction": "near_field"}, "session.input_audio_noise_reduction"),
    ({"input_audio_noise_reduction": {"type": "near_field", "level": 3}}, "session.input_audio_noise_reduction.level"),
    ({"include": ["item.input_audio_transcription.words"]}, "session.include"),
    ({"voice": "alloy"}, "session.voice"),
    ({"input_audio_transcription": {"model": "gpt-4o-transcribe-diarize"}}, "session.input_audio_transcription.model"),
    ({"input_audio_transcription": {"language": "xx-nope"}}, "session.input_audio_transcription.language"),
    ({"input_audio_transcription": {"prompt": "x" * 5000}}, "session.input_audio_transcription.prompt"),
    # English-only (tiny.en): an entry that is not English is named, as languages[N]
    ({"input_audio_transcription": {"languages": ["en", "de"]}}, "session.input_audio_transcription.languages[1]"),
    ({"input_audio_transcription": {"language": "en", "languages": ["de"]}},
     "session.input_audio_transcription.languages[0]"),
    ({"input_audio_transcription": {"languages": "en"}}, "session.input_audio_transcription.languages"),
    # a GA-shaped session (it carries `type`) sent in the beta event is named where it sits
    ({"type": "transcription", "audio": {"input": {"transcription": {"model": "gpt-4o-transcribe-diarize"}}}},
     "session.audio.input.transcription.model"),
    ({"type": "transcription", "audio": {"input": {"transcription": {"language": "xx-nope"}}}},
     "session.audio.input.transcription.language"),
])
def test_an_update_that_cannot_be_honoured_names_its_field(client: TestClient[Any], update: dict[str, Any],
                                                           param: str) -> None:
    with client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        ws.receive_json(timeout=30)
        ws.send_text(json.dumps({"type": "transcription_session.update", "event_id": "evt_7", "session": update}))
        event = ws.receive_json(timeout=30)
        assert event["type"] == "error" and event["error"]["param"] == param, event
        assert event["error"]["event_id"] == "evt_7" and event["error"]["message"]
        # the session goes on
        ws.send_text(json.dumps({"type": "transcription_session.update", "session": {}}))
        assert ws.receive_json(timeout=30)["type"] == "transcription_session.updated"


def joined(logprobs: list[dict[str, Any]]) -> str:
    """The text of OpenAI's logprobs entries, from their bytes."""
    assert all(set(e) == {"token", "logprob", "bytes"} and e["logprob"] <= 0 for e in logprobs), logprobs
    return b"".join(bytes(e["bytes"]) for e in logprobs).decode("utf-8", errors="replace")


def test_a_telephony_session_with_openais_noise_reduction_and_logprobs_is_applied_and_transcribed(
        client: TestClient[Any], state: AppState) -> None:
    """OpenAI's realtime-transcription guide's session (noise reduction, logprobs included) as a Twilio-style voice
    agent sends it: all of it is applied — the μ-law format too — and the call is transcribed, its tokens' log
    probabilities on each delta and on the transcript."""
    from audio.noise_reduction import HighPass

    with client.websocket_connect("/v1/realtime?intent=transcription") as ws:
        assert ws.receive_json(timeout=30)["session"]["audio"]["input"]["noise_reduction"] is None
        ws.send_text(json.dumps({"type": "session.update", "session": {
            "type": "transcription", "include": ["item.input_audio_transcription.logprobs"],
            "audio": {"input": {"format": {"type": "audio/pcmu"},
                                "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                                "turn_detection": {"type": "server_vad"}, "noise_reduction": {"type": "far_field"}}}}}))
        updated = until(ws, "session.updated")
        assert [e for e in updated if e["type"] == "error"] == []
        session_object = updated[-1]["session"]
        assert session_object["audio"]["input"]["format"] == {"type": "audio/pcmu"}
        assert session_object["audio"]["input"]["noise_reduction"] == {"type": "far_field"}
        assert session_object["include"] == ["item.input_audio_transcription.logprobs"]
        (session,) = [s for s in state.speech.sessions.values() if not s.closed]  # type: ignore[union-attr]
        assert session.options.noise_reduction == "far_field" and session.options.logprobs
        assert isinstance(session._denoise, HighPass) and session._denoise.kind == "far_field"
        call = np.concatenate([np.zeros(4000, np.float32), voiced(1.5, 8000), np.zeros(12000, np.float32)])
        ulaw = encode_g711(call, "ulaw")
        for i in range(0, len(ulaw), 160):  # Twilio's 20 ms media frames
            ws.send_text(json.dumps({"type": "input_audio_buffer.append",
                                     "audio": base64.b64encode(ulaw[i:i + 160]).decode()}))
        events = until(ws, "conversation.item.input_audio_transcription.completed")
    kinds = [e["type"] for e in events]
    assert "error" not in kinds
    # read as 8 kHz μ-law: the speech from 0.5 s to 2 s (with 300 ms of padding), not a fraction of a second's noise
    started, stopped = (events[kinds.index(f"input_audio_buffer.speech_{k}")] for k in ("started", "stopped"))
    assert 150 <= started["audio_start_ms"] <= 250 and 1800 <= stopped["audio_end_ms"] <= 2700
    deltas = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.delta"]
    done = events[-1]
    assert done["transcript"] and done["transcript"] == "".join(d["delta"] for d in deltas)
    # Each event's logprobs join to exactly its text (the first token less the space the text leaves out).
    assert joined(done["logprobs"]) == done["transcript"]
    assert deltas and all(joined(d["logprobs"]) == d["delta"] for d in deltas)
    assert done["logprobs"] == [x for d in deltas for x in d["logprobs"]]


def test_a_refused_update_applies_nothing_of_itself(client: TestClient[Any], state: AppState) -> None:
    with client.websocket_connect("/v1/realtime?intent=transcription") as ws:
        ws.receive_json(timeout=30)
        ws.send_text(json.dumps({"type": "session.update", "session": {
            "type": "transcription", "include": ["item.input_audio_transcription.logprobs"],
            "audio": {"input": {"format": {"type": "audio/pcmu"}, "noise_reduction": {"type": "near_field"},
                                "turn_detection": {"type": "server_vad", "threshold": 1.5}}}}}))
        error = until(ws, "error")[-1]["error"]
        assert error["param"] == "session.audio.input.turn_detection.threshold"
        ws.send_text(json.dumps({"type": "session.update", "session": {"type": "transcription"}}))
        shown = until(ws, "session.updated")[-1]["session"]
        (session,) = [s for s in state.speech.sessions.values() if not s.closed]  # type: ignore[union-attr]
        assert session.options.noise_reduction is None and not session.options.logprobs
    assert shown["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": SR}
    assert shown["audio"]["input"]["noise_reduction"] is None and shown["include"] is None


def test_beta_noise_reduction_and_includes_are_shown_back_and_turned_off(client: TestClient[Any]) -> None:
    both = ["item.input_audio_transcription.logprobs", "item.input_audio_transcription.tentative"]
    with client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        assert ws.receive_json(timeout=30)["session"]["input_audio_noise_reduction"] is None
        ws.send_text(json.dumps({"type": "transcription_session.update", "session": {
            "input_audio_format": "g711_ulaw", "input_audio_noise_reduction": {"type": "near_field"},
            "include": both}}))
        on = until(ws, "transcription_session.updated")[-1]["session"]
        ws.send_text(json.dumps({"type": "transcription_session.update", "session": {
            "input_audio_noise_reduction": None, "include": ["item.input_audio_transcription.words"]}}))
        refused = until(ws, "error")[-1]["error"]
        ws.send_text(json.dumps({"type": "transcription_session.update", "session": {
            "input_audio_noise_reduction": None, "include": None}}))
        off = until(ws, "transcription_session.updated")[-1]["session"]
    assert on["input_audio_format"] == "g711_ulaw" and on["input_audio_noise_reduction"] == {"type": "near_field"}
    assert on["include"] == both
    # an include not served is not taken for an unknown one: the message says what a session takes
    assert refused["param"] == "session.include" and all(x in refused["message"] for x in both)
    assert off["input_audio_noise_reduction"] is None and off["include"] is None
    assert off["input_audio_format"] == "g711_ulaw"


def test_speech_becomes_one_item_with_the_realtime_grammar(client: TestClient[Any]) -> None:
    with client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        ws.receive_json(timeout=30)
        silence = np.zeros(int(0.5 * SR), np.float32)
        for chunk in np.array_split(np.concatenate([silence, voiced(1.5), silence, silence, silence]), 10):
            append(ws, chunk)
        events = until(ws, "conversation.item.input_audio_transcription.completed")
    kinds = [e["type"] for e in events]
    started, stopped = kinds.index("input_audio_buffer.speech_started"), kinds.index("input_audio_buffer.speech_stopped")
    committed, created = kinds.index("input_audio_buffer.committed"), kinds.index("conversation.item.created")
    assert started < stopped < committed < created < len(kinds) - 1
    item = events[started]["item_id"]
    # the prefix padding (300 ms) comes before the speech at 500 ms
    assert 150 <= events[started]["audio_start_ms"] <= 250 and 1800 <= events[stopped]["audio_end_ms"] <= 2700
    assert {e.get("item_id") for e in events if "item_id" in e} == {item}
    assert events[committed]["previous_item_id"] is None
    assert events[created]["item"]["id"] == item and events[created]["item"]["role"] == "user"
    deltas = "".join(e["delta"] for e in events if e["type"].endswith("transcription.delta"))
    done = events[-1]
    assert done["transcript"] == deltas and done["content_index"] == 0 and done["usage"]["type"] == "duration"
    assert all(e["event_id"].startswith("event_") for e in events)


def test_openai_agents_streamed_stt_with_its_default_semantic_vad(client: TestClient[Any], state: AppState) -> None:
    """What openai-agents' OpenAISTTTranscriptionSession sends by default: semantic_vad served as server VAD, a
    transcript per utterance, then its end of input (a commit and a clear) answered without a fatal error."""
    with client.websocket_connect("/v1/realtime?intent=transcription") as ws:
        assert ws.receive_json(timeout=30)["type"] == "session.created"
        ws.send_text(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 24000}, "transcription": {"model": "whisper-1"},
            "turn_detection": {"type": "semantic_vad"}}}}}))
        updated = ws.receive_json(timeout=30)
        assert updated["type"] == "session.updated", updated
        assert updated["session"]["audio"]["input"]["turn_detection"] == {"type": "semantic_vad", "eagerness": "auto"}
        (session,) = [s for s in state.speech.sessions.values() if not s.closed]  # type: ignore[union-attr]
        assert session.options.vad and session.options.vad_min_silence_ms == EAGERNESS_SILENCE_MS["auto"]
        silence = np.zeros(int(0.5 * SR), np.float32)
        for chunk in np.array_split(np.concatenate([silence, voiced(1.5), silence, silence, silence]), 10):
            append(ws, chunk)
        events = until(ws, "conversation.item.input_audio_transcription.completed")
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit", "event_id": "final"}))
        ws.send_text(json.dumps({"type": "input_audio_buffer.clear"}))
        events += until(ws, "input_audio_buffer.cleared")
    kinds = [e["type"] for e in events]
    assert kinds.index("input_audio_buffer.speech_started") < kinds.index("input_audio_buffer.speech_stopped") \
        < kinds.index("input_audio_buffer.committed") < kinds.index("conversation.item.added") \
        < kinds.index("conversation.item.done") < kinds.index("conversation.item.input_audio_transcription.completed")
    # the only error the SDK does not treat as fatal: its end-of-input commit finding the buffer already committed
    errors = [e["error"] for e in events if e["type"] == "error"]
    assert all(e["code"] == "input_audio_buffer_commit_empty" and e["event_id"] == "final" for e in errors), errors


@pytest.mark.parametrize("eagerness", ["low", "medium", "high", "auto"])
def test_semantic_vad_eagerness_is_the_pause_that_ends_a_turn(client: TestClient[Any], state: AppState,
                                                              eagerness: str) -> None:
    with client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        ws.receive_json(timeout=30)
        ws.send_text(json.dumps({"type": "transcription_session.update", "session": {
            "turn_detection": {"type": "semantic_vad", "eagerness": eagerness, "create_response": False}}}))
        updated = ws.receive_json(timeout=30)
        assert updated["type"] == "transcription_session.updated", updated
        assert updated["session"]["turn_detection"] == {"type": "semantic_vad", "eagerness": eagerness}
        (session,) = [s for s in state.speech.sessions.values() if not s.closed]  # type: ignore[union-attr]
        assert session.options.vad_min_silence_ms == EAGERNESS_SILENCE_MS[eagerness]
        # back to server VAD: its own defaults, not the eagerness's pause
        ws.send_text(json.dumps({"type": "transcription_session.update", "session": {
            "turn_detection": {"type": "server_vad"}}}))
        assert ws.receive_json(timeout=30)["session"]["turn_detection"]["silence_duration_ms"] == 500


@pytest.mark.parametrize("frame, code", [
    ("not json", "invalid_json"),
    ("[1, 2]", "invalid_event"),
    ('{"type": "input_audio_buffer.bogus"}', "unknown_event"),
    ('{"type": "response.create"}', "unsupported_event"),
    ('{"type": "input_audio_buffer.append", "audio": "%%%not-base64"}', "invalid_base64"),
    ('{"type": "input_audio_buffer.append", "audio": "AAA="}', "invalid_pcm_length"),  # 2 bytes... then 1 odd
    ('{"type": "input_audio_buffer.append", "audio": 7}', "invalid_value"),
])
def test_a_bad_frame_gets_an_error_event_and_the_audio_is_kept(client: TestClient[Any], state: AppState,
                                                               frame: str, code: str) -> None:
    if code == "invalid_pcm_length":
        frame = json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\x01\x02\x03").decode()})
    with client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        ws.receive_json(timeout=30)
        (session,) = [s for s in state.speech.sessions.values() if not s.closed]  # type: ignore[union-attr]
        append(ws, voiced(0.5))
        ws.send_text(frame)
        error = until(ws, "error")[-1]
        assert error["error"]["code"] == code, error
        append(ws, voiced(0.25))
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit"}))
        until(ws, "input_audio_buffer.committed")
        assert session.received_seconds == pytest.approx(0.75, abs=0.03)  # soxr holds a few ms


def test_an_update_mid_session_is_taken_for_the_items_that_begin_after_it(
        client: TestClient[Any], state: AppState, monkeypatch: pytest.MonkeyPatch) -> None:
    """LiveKit's STT.update_options re-sends its whole GA session.update mid-stream, and any `error` event kills its
    stream (Pipecat reconnects): the update is answered `session.updated`; the item being spoken keeps the prompt it
    began with, the next is decoded with the new one (its keywords joined in)."""
    from mlx_whisper.tokenizer import get_tokenizer

    from audio.scheduler import WhisperScheduler

    prompts: list[tuple[int, ...]] = []
    decode = WhisperScheduler.decode
    monkeypatch.setattr(WhisperScheduler, "decode", lambda self, loaded, request, *rest: (
        prompts.append(request.prompt), decode(self, loaded, request, *rest))[1])
    wanted = tuple(get_tokenizer(False).encode(" Dashwood Marianne"))

    def update(**transcription: Any) -> dict[str, Any]:
        return {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": SR}, "turn_detection": None,
            "transcription": {"model": "whisper-1", **transcription}}}}}

    with client.websocket_connect("/v1/realtime?intent=transcription") as ws:
        assert ws.receive_json(timeout=30)["type"] == "session.created"
        ws.send_text(json.dumps(update(language="en")))
        until(ws, "session.updated")
        append(ws, voiced(1.0))
        ws.send_text(json.dumps(update(language="en", prompt="Dashwood", keywords=["Marianne"])))  # mid-item
        events = until(ws, "session.updated")
        assert events[-1]["session"]["audio"]["input"]["transcription"]["prompt"] == "Dashwood"
        append(ws, voiced(0.5))
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit"}))
        events += until(ws, "conversation.item.input_audio_transcription.completed")
        first = len(prompts)
        append(ws, voiced(1.0))
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit"}))
        events += until(ws, "conversation.item.input_audio_transcription.completed")
        ws.send_text(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 300}}}}}))
        events += until(ws, "session.updated")
        (session,) = [s for s in state.speech.sessions.values() if not s.closed]  # type: ignore[union-attr]
        assert session.options.vad and session.options.vad_min_silence_ms == 300
    assert not [e for e in events if e["type"] == "error"], events
    assert first and all(wanted[0] not in p for p in prompts[:first])  # the item spoken at the update: as it began
    assert len(prompts) > first and all(p[:len(wanted)] == wanted for p in prompts[first:])


def test_transcription_delay_sets_how_many_decodes_agree_in_either_dialect(client: TestClient[Any],
                                                                          state: AppState) -> None:
    """Pipecat's realtime STT sends `delay` (openai-python's AudioTranscription.delay) and reconnected three times on
    the error it got, then died: it is the decodes that must agree before text is committed, and is shown back."""
    pipecat = {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {"transcription": {
        "model": "gpt-realtime-whisper", "language": "en", "delay": "low"}}}}}
    with client.websocket_connect("/v1/realtime?intent=transcription") as ws:
        assert ws.receive_json(timeout=30)["type"] == "session.created"
        ws.send_text(json.dumps(pipecat))
        updated = ws.receive_json(timeout=30)
        assert updated["type"] == "session.updated", updated
        assert updated["session"]["audio"]["input"]["transcription"]["delay"] == "low"
        (session,) = [s for s in state.speech.sessions.values() if not s.closed]  # type: ignore[union-attr]
        assert session.live.agreement == 2
        append(ws, voiced(0.5))  # mid-session: from the decodes after it
        pipecat["session"]["audio"]["input"]["transcription"]["delay"] = "xhigh"  # type: ignore[index]
        ws.send_text(json.dumps(pipecat))
        assert until(ws, "session.updated")[-1]["session"]["audio"]["input"]["transcription"]["delay"] == "xhigh"
        assert session.live.agreement == 4
        ws.send_text(json.dumps({"type": "session.update", "event_id": "evt_d", "session": {
            "type": "transcription", "audio": {"input": {"transcription": {"delay": "soon"}}}}}))
        error = until(ws, "error")[-1]["error"]
        assert error["param"] == "session.audio.input.transcription.delay" and "minimal" in error["message"]
        assert session.live.agreement == 4  # refused: nothing of it applied
    with client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        ws.receive_json(timeout=30)
        ws.send_text(json.dumps({"type": "transcription_session.update", "session": {
            "input_audio_transcription": {"model": "whisper-1", "delay": "minimal"}}}))
        updated = until(ws, "transcription_session.updated")[-1]
        assert updated["session"]["input_audio_transcription"]["delay"] == "minimal"
        (session,) = [s for s in state.speech.sessions.values() if not s.closed]  # type: ignore[union-attr]
        assert session.live.agreement == 1 and session.options.agreement == 1


def test_a_fault_inside_the_socket_is_logged_and_a_server_error_event(client: TestClient[Any], state: AppState,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    from audio.sessions import LiveSession

    def broken(self: LiveSession) -> None:
        raise RuntimeError("a bug in clear")

    monkeypatch.setattr(LiveSession, "clear", broken)
    with caplog.at_level("ERROR", logger="tandem.speech"), \
            client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        ws.receive_json(timeout=30)
        ws.send_text(json.dumps({"type": "input_audio_buffer.clear", "event_id": "c1"}))
        error = until(ws, "error")[-1]["error"]
        assert (error["type"], error["event_id"]) == ("server_error", "c1") and "a bug" not in error["message"]
        append(ws, voiced(0.5))  # the session goes on
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit"}))
        until(ws, "input_audio_buffer.committed")
    (record,) = [r for r in caplog.records if r.exc_info]
    assert "a bug in clear" in str(record.exc_info[1])  # type: ignore[index]


@pytest.mark.parametrize("text, code", [("[" * 200_000 + "]" * 200_000, "json_too_deep"),
                                        ('{"type": "input_audio_buffer.clear", "x": ' + "[" * 100 + "]" * 100 + "}",
                                         "json_too_deep")])
def test_a_message_nested_too_deep_is_refused_and_the_session_goes_on(client: TestClient[Any], text: str,
                                                                      code: str) -> None:
    with client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        ws.receive_json(timeout=30)
        ws.send_text(text)
        error = until(ws, "error")[-1]["error"]
        assert (error["type"], error["code"]) == ("invalid_request_error", code)
        ws.send_text(json.dumps({"type": "transcription_session.update", "session": {}}))
        until(ws, "transcription_session.updated")


def test_a_realtime_append_error_names_the_audio_field(client: TestClient[Any]) -> None:
    with client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        ws.receive_json(timeout=30)
        for audio, code in ((base64.b64encode(b"\x01\x02\x03").decode(), "invalid_pcm_length"), ("", "empty_audio")):
            ws.send_text(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
            error = until(ws, "error")[-1]["error"]
            assert (error["code"], error["param"]) == (code, "audio")


@pytest.mark.parametrize("rate", [24000, 44100, 48000])
def test_a_commit_takes_all_the_audio_sent_before_it(client: TestClient[Any], rate: int) -> None:
    with client.websocket_connect("/v1/realtime?intent=transcription") as ws:
        ws.receive_json(timeout=30)
        ws.send_text(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": rate}, "turn_detection": None}}}}))
        until(ws, "session.updated")
        for chunk in np.array_split(voiced(2.0, rate), 8):
            append(ws, chunk)
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit"}))
        done = until(ws, "conversation.item.input_audio_transcription.completed")[-1]
    # soxr held back its last ~20 ms until the commit flushed it (1.987 s at 24 kHz before)
    assert done["usage"]["seconds"] == pytest.approx(2.0, abs=0.002)


@pytest.mark.parametrize("query, param", [("rate=abc", "rate"), ("vad=maybe", "vad"), ("interval=x", "interval"),
                                          ("rate=16000.5", "rate")])
def test_a_query_value_that_is_no_value_is_an_error_event_naming_it(client: TestClient[Any], query: str,
                                                                    param: str) -> None:
    with client.websocket_connect(f"/v1/audio/live?{query}") as ws:  # was a bare 403 at the handshake
        event = ws.receive_json(timeout=30)
    assert event["type"] == "error" and (event["param"], event["code"]) == (param, "invalid_value")


@pytest.mark.parametrize("query, rate, encoding", [("", 16000, "f32le"), ("?rate=48000&encoding=s16le", 48000, "s16le"),
                                                   ("?vad=off", 16000, "f32le"), ("?encoding=ulaw", 8000, "ulaw"),
                                                   ("?encoding=alaw&rate=16000", 16000, "alaw")])
def test_binary_frames_are_announced_in_the_format_they_are_read(client: TestClient[Any], query: str, rate: int,
                                                                 encoding: str) -> None:
    with client.websocket_connect(f"/v1/audio/live{query}") as ws:
        created = ws.receive_json(timeout=30)
    assert created["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": rate, "encoding": encoding}


def test_commit_clear_and_an_empty_commit(client: TestClient[Any]) -> None:
    with client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        manual_turns(ws)
        append(ws, voiced(1.0))
        ws.send_text(json.dumps({"type": "input_audio_buffer.clear"}))
        until(ws, "input_audio_buffer.cleared")
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit", "event_id": "c9"}))
        error = until(ws, "error")[-1]["error"]
        assert error["code"] == "input_audio_buffer_commit_empty" and error["event_id"] == "c9"
        append(ws, voiced(0.5))
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit"}))
        events = until(ws, "conversation.item.input_audio_transcription.completed")
    created = [e for e in events if e["type"] == "conversation.item.created"]
    assert len(created) == 1
    # only the half second after the clear was transcribed as the item
    assert events[-1]["usage"]["seconds"] == pytest.approx(0.5, abs=0.05)


def test_replies_come_in_the_order_the_client_events_were_handled(client: TestClient[Any]) -> None:
    shown = {"input_audio_buffer.cleared", "input_audio_buffer.committed", "conversation.item.created", "error"}
    with client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        manual_turns(ws)
        append(ws, voiced(0.5))
        ws.send_text(json.dumps({"type": "input_audio_buffer.clear"}))
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit", "event_id": "c1"}))
        # the commit came after the clear: its error after the clear's event
        assert [e["type"] for e in until(ws, "error") if e["type"] in shown] == ["input_audio_buffer.cleared", "error"]
        append(ws, voiced(0.5))
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit", "event_id": "c2"}))
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit", "event_id": "c3"}))
        events = until(ws, "error")
    kinds = [e["type"] for e in events]
    committed = kinds.index("input_audio_buffer.committed")
    assert kinds[committed + 1] == "conversation.item.created"  # nothing between them
    assert events[-1]["error"]["event_id"] == "c3" and "error" not in kinds[:-1]


def test_a_session_that_cannot_keep_up_gets_an_error_event(whisper_dir: Path) -> None:
    state = install_speech(AppState(), SpeechConfig(model=str(whisper_dir), resident=True, max_lag_sec=1.0))
    with TestClient(create_app(state)) as c, c.websocket_connect("/v1/realtime?intent=transcription") as ws:
        ws.receive_json(timeout=30)
        speech = state.speech
        assert speech is not None and speech.live.max_lag_s == 1.0  # type: ignore[attr-defined]
        (session,) = speech.sessions.values()
        append(ws, voiced(3.0))  # three seconds at once: alone over the backlog cap, refused whole for good (a
        error = until(ws, "error")[-1]["error"]  # 429 was retried for ever); backlog 429s: tests/audio/test_sessions
        assert error["code"] == "chunk_too_long" and error["type"] != "rate_limit_error"
        assert session.received_seconds == 0.0
        append(ws, voiced(0.5))
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit"}))
        until(ws, "input_audio_buffer.committed")
        assert session.received_seconds == pytest.approx(0.5, abs=0.03)


def test_closing_the_socket_cancels_the_session(client: TestClient[Any], state: AppState) -> None:
    speech = state.speech
    assert speech is not None
    with client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        ws.receive_json(timeout=30)
        (session,) = [s for s in speech.sessions.values() if not s.closed]
        append(ws, voiced(2.0))

    async def ended() -> None:
        with anyio.fail_after(60):  # a safety net; the event is what the test waits for
            await session.ended()

    client.blocking_portal.call(ended)
    assert session.scope.cancel_called and session.id not in speech.sessions


def test_an_unknown_first_message_does_not_decide_the_mode(client: TestClient[Any]) -> None:
    # {"type": "ping"} first put /v1/audio/live in binary-frame mode: a session.update after it was refused.
    with client.websocket_connect("/v1/audio/live") as ws:
        ws.receive_json(timeout=30)
        ws.send_text('{"type": "ping"}')
        error = until(ws, "error")[-1]
        assert error["code"] == "unknown_event" and "Realtime" in error["message"]
        ws.send_text(json.dumps({"type": "session.update", "session": {"type": "transcription"}}))
        assert until(ws, "session.updated")[-1]["session"]["type"] == "transcription"


def test_the_format_the_query_announced_holds_for_realtime_events(client: TestClient[Any]) -> None:
    # session.created shows the query's format; a session.update naming none keeps it (it became 24 kHz pcm16).
    with client.websocket_connect("/v1/audio/live?rate=48000") as ws:
        announced = ws.receive_json(timeout=30)["session"]["audio"]["input"]["format"]
        ws.send_text(json.dumps({"type": "session.update", "session": {"type": "transcription"}}))
        updated = until(ws, "session.updated")[-1]["session"]["audio"]["input"]["format"]
    assert announced == updated == {"type": "audio/pcm", "rate": 48000, "encoding": "f32le"}
    with client.websocket_connect("/v1/audio/live") as ws:  # no format asked for: Realtime's own default
        ws.receive_json(timeout=30)
        ws.send_text(json.dumps({"type": "session.update", "session": {"type": "transcription"}}))
        assert until(ws, "session.updated")[-1]["session"]["audio"]["input"]["format"] == {
            "type": "audio/pcm", "rate": 24000}


def test_a_realtime_event_after_a_pcm_frame_says_the_socket_speaks_frames(client: TestClient[Any]) -> None:
    # The first PCM frame makes /v1/audio/live a binary-frame socket: a Realtime event after it is refused saying so.
    with client.websocket_connect("/v1/audio/live?rate=16000&encoding=s16le") as ws:
        ws.receive_json(timeout=30)
        ws.send_bytes(b"\0" * 400)
        ws.send_text('{"type": "input_audio_buffer.clear"}')
        error = until(ws, "error")[-1]
    assert error["code"] == "unknown_event" and "before any PCM frame" in error["message"]


def test_a_message_within_the_frame_limit_meets_no_second_size_rule(client: TestClient[Any]) -> None:
    # A 15 MiB decoded-audio rule beside the guard's frame bytes: never reached by a base64 append (20 MiB of
    # text, past granian's 16 MiB frame), and a second limit in other units for a binary frame.
    with client.websocket_connect("/v1/audio/live?rate=16000&encoding=s16le") as ws:
        ws.receive_json(timeout=30)
        ws.send_bytes(b"\0" * (15 * 2**20 + 2))  # within the guard's 16 MiB; 491 s of audio
        error = until(ws, "error")[-1]
    assert error["code"] == "chunk_too_long", error  # judged by the session's caps


def test_binary_frames_bad_text_and_a_late_transcript(client: TestClient[Any]) -> None:
    f32 = voiced(1.0, 16000).astype("<f4").tobytes()
    with client.websocket_connect("/v1/audio/live?interval=0") as ws:
        created = ws.receive_json(timeout=30)
        assert created["type"] == "session.created" and created["id"].startswith("sess_")
        ws.send_bytes(f32)
        for bad in ("hello", "[1]", '{"type": "bogus"}'):
            ws.send_text(bad)
            error = until(ws, "error")[-1]
            assert error["code"] and error["message"] and error["error"]["code"] == error["code"]
        ws.send_bytes(b"\x00" * 7)  # not whole f32 samples
        error = until(ws, "error")[-1]
        assert (error["code"], error["param"]) == ("invalid_pcm_length", "audio")  # a socket has no "body"
        ws.send_text('{"type": "finish"}')
        ws.send_text('{"type": "finish"}')  # read after finish: answered, not ignored
        events = until(ws, "transcript.done")
    assert any(e["type"] == "error" for e in events)
    assert events[-1]["received_seconds"] == pytest.approx(1.0)  # the audio before the bad frames was kept


@pytest.mark.parametrize("fails", [False, True])
def test_the_errors_of_frames_before_a_finish_all_come_before_the_transcript(client: TestClient[Any],
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          fails: bool) -> None:
    # Bad frames then a finish at once lost some of their errors (7 of 10): the transcript (or the finish's own
    # error) and the close went out while the log's writer still held them. Here the writer reads the log only once
    # the finish has returned.
    from audio.errors import SessionClosed
    from audio.sessions import LiveSession

    gates: list[anyio.Event] = []  # made on the event loop, by whichever of the two comes first

    def gate() -> anyio.Event:
        gates[:] = gates or [anyio.Event()]
        return gates[0]

    events, finish = LiveSession.events, LiveSession.finish

    async def late_events(self: LiveSession, start: int = 0) -> Any:
        await gate().wait()
        async for ev in events(self, start):
            yield ev

    async def finish_then_open(self: LiveSession) -> Any:
        t = await finish(self)
        gate().set()
        if fails:
            raise SessionClosed("the session failed at its end")
        return t

    monkeypatch.setattr(LiveSession, "events", late_events)
    monkeypatch.setattr(LiveSession, "finish", finish_then_open)
    with client.websocket_connect("/v1/audio/live?rate=16000&encoding=s16le&interval=0") as ws:
        ws.receive_json(timeout=30)
        for _ in range(5):
            ws.send_bytes(b"\x01\x02\x03")  # not whole s16le samples
        ws.send_text('{"type": "finish"}')
        got = []
        with pytest.raises(WebSocketDisconnect) as closed:
            while True:
                got.append(ws.receive_json(timeout=30))
    last = ("error", "session_closed") if fails else ("transcript.done", None)
    assert [(e["type"], e.get("code")) for e in got if e["type"] != "transcript.partial"] == [
        ("error", "invalid_pcm_length")] * 5 + [last]
    assert closed.value.code == (1011 if fails else 1000)


def test_a_full_house_is_refused_never_evicted(client: TestClient[Any], state: AppState,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    speech = state.speech
    assert speech is not None
    monkeypatch.setattr(speech, "clock", lambda: 1000.0)  # time stands still: the sessions opened at 1000
    with contextlib.ExitStack() as stack:
        for _ in range(3):
            stack.enter_context(client.websocket_connect("/v1/realtime?intent=transcription")).receive_json(timeout=30)
        client.blocking_portal.call(_caught_up, speech)
        with client.websocket_connect("/v1/realtime?intent=transcription") as ws:
            event = ws.receive_json(timeout=30)
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_json(timeout=30)
        assert event["type"] == "error" and event["error"]["code"] == "session_unavailable"
        assert "300 s" in event["error"]["message"] and closed.value.code == 1013
        # Retry-After is when the first of them can expire (--session-ttl 300 s), not a fixed 5 s
        r = client.post("/v1/audio/sessions", json={})
        assert r.status_code == 429 and r.headers["retry-after"] == "300", r.headers
        assert "--session-ttl" in r.json()["error"]["message"]
        assert len(speech.sessions) == 3  # nobody was evicted


async def _caught_up(speech: Any) -> None:
    for session in list(speech.sessions.values()):
        await session.caught_up()


def test_a_live_config_reaches_the_sessions(state: AppState) -> None:
    speech = state.speech
    assert speech is not None and isinstance(speech.live, LiveConfig)  # type: ignore[attr-defined]
    assert speech.live.context == "auto"  # type: ignore[attr-defined]  # fitted on a CPU, whole on a GPU


def test_whole_window_live_decodes_reach_the_sessions(whisper_dir: Path) -> None:
    state = install_speech(AppState(), SpeechConfig(model=str(whisper_dir), live_context="whole"))
    with TestClient(create_app(state)):
        assert state.speech is not None and state.speech.live.context == "whole"  # type: ignore[attr-defined]


def test_stats_show_the_caps_and_the_step_budget(client: TestClient[Any]) -> None:
    speech = client.get("/stats").json()["speech"]
    assert speech["max_sessions"] == 3 and speech["vad_default"] is True
    assert {"max_session_s", "max_session_lag_s", "max_buffered_audio_s", "buffered_audio_s"} <= set(speech)
    scheduler = speech["scheduler"]
    assert scheduler["chat_share"] == 0.3 and scheduler["encoder_positions_per_step"] == 375


class Restarting:
    """The speech service of an --isolate server whose engine process is restarting: every call refuses."""

    def __getattr__(self, name: str) -> Any:
        raise EngineRestarting("The engine process is restarting; try again shortly.", retry_after=10)


@pytest.mark.parametrize("path", ["/v1/realtime?intent=transcription", "/v1/audio/live"])
def test_a_session_opened_while_the_engine_process_restarts_gets_an_error_and_try_again_later(path: str) -> None:
    state = AppState()
    state.speech = Restarting()  # type: ignore[assignment]
    with TestClient(create_app(state)) as c, c.websocket_connect(path) as ws:
        event = ws.receive_json(timeout=30)
        assert event["type"] == "error" and event["error"]["code"] == "engine_restarting"
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json(timeout=30)
    assert closed.value.code == 1013


def test_replies_owed_when_the_engine_process_dies_go_out_before_its_error(client: TestClient[Any],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # --isolate: the session's log ended with the engine process while error replies waited for their marks in it;
    # the socket closed without them. The log here is never read and ends (EngineRestarting) at the client's clear.
    from audio.sessions import LiveSession

    gates: list[anyio.Event] = []

    def gate() -> anyio.Event:
        gates[:] = gates or [anyio.Event()]
        return gates[0]

    async def dying_events(self: LiveSession, start: int = 0) -> Any:
        await gate().wait()
        raise EngineRestarting("The engine process is restarting; try again shortly.", retry_after=10)
        yield  # an async generator, as the log's reader takes it

    monkeypatch.setattr(LiveSession, "events", dying_events)
    monkeypatch.setattr(LiveSession, "clear", lambda self: gate().set())
    with client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        ws.receive_json(timeout=30)
        for n in range(3):
            ws.send_text(json.dumps({"type": "bogus", "event_id": f"e{n}"}))
        ws.send_text(json.dumps({"type": "input_audio_buffer.clear"}))
        got = []
        with pytest.raises(WebSocketDisconnect) as closed:
            while True:
                got.append(ws.receive_json(timeout=30)["error"])
    assert [(e["code"], e["event_id"]) for e in got] == [("unknown_event", f"e{n}") for n in range(3)] + [
        ("engine_restarting", None)]
    assert closed.value.code == 1013


def _audio_seconds(state: AppState) -> float:
    return float(state.metrics.registry.get_sample_value("tandem_whisper_audio_seconds_total") or 0.0)


def test_live_audio_is_counted_in_the_audio_seconds(client: TestClient[Any], state: AppState) -> None:
    # Only file audio reached tandem_whisper_audio_seconds_total; live sessions' audio was left out.
    before = _audio_seconds(state)
    with client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        manual_turns(ws)
        append(ws, voiced(1.0))  # 24 kHz PCM16
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit"}))
        until(ws, "input_audio_buffer.committed")  # the append before it was taken
    realtime = _audio_seconds(state)
    assert realtime - before == pytest.approx(1.0, abs=1e-6)
    with client.websocket_connect("/v1/audio/live?rate=16000&encoding=f32le") as ws:
        ws.receive_json(timeout=30)
        ws.send_bytes(voiced(0.5, 16000).tobytes())
        ws.send_text(json.dumps({"type": "finish"}))
        until(ws, "transcript.done")
    assert _audio_seconds(state) - realtime == pytest.approx(0.5, abs=1e-6)


class Clock:
    """Monotonic seconds the test moves by hand (the speech service's and its sessions' idle clock)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def idle_house(whisper_dir: Path) -> Iterator[tuple[TestClient[Any], AppState, Clock]]:
    """One place, a TTL of 60 s, and a clock the test moves; expiry is run by hand on the app's loop."""
    state = install_speech(AppState(), SpeechConfig(model=str(whisper_dir), resident=True, max_sessions=1,
                                                    session_ttl_sec=60))
    clock = Clock()
    with TestClient(create_app(state)) as c:
        assert state.speech is not None
        state.speech.clock = clock  # type: ignore[attr-defined]  # sessions opened from now on use it
        yield c, state, clock


def _expire(client: TestClient[Any], state: AppState) -> None:
    speech = state.speech
    assert speech is not None

    async def run() -> None:  # on the app's loop: its sessions' events belong there
        speech._expire(speech.clock())  # type: ignore[attr-defined]

    client.blocking_portal.call(run)


@pytest.mark.parametrize("path", ["/v1/realtime?intent=transcription", "/v1/audio/live"])
def test_a_silent_socket_gives_its_place_up_after_the_session_ttl(idle_house: tuple[TestClient[Any], AppState, Clock],
                                                                 path: str) -> None:
    # A socket that sent nothing held its place for as long as it stayed open: 64 of them locked every client out.
    client, state, clock = idle_house
    with client.websocket_connect(path) as ws:
        ws.receive_json(timeout=30)  # created
        clock.now += 59
        _expire(client, state)
        ws.send_text('{"type": "bogus"}')  # any message says the client is there, even one refused
        assert until(ws, "error")[-1]["error"]["code"] == "unknown_event"
        clock.now += 59  # 118 s since it opened, 59 since its last message
        _expire(client, state)
        assert state.speech is not None and len(state.speech.sessions) == 1
        clock.now += 2
        _expire(client, state)
        event = ws.receive_json(timeout=30)
        assert event["type"] == "error" and event["error"]["code"] == "session_expired"
        assert "--session-ttl" in event["error"]["message"] and "60 s" in event["error"]["message"]
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json(timeout=30)
    assert closed.value.code == 1000  # a normal close: nothing went wrong
    assert not state.speech.sessions
    with client.websocket_connect(path) as ws:  # its place is free again
        assert ws.receive_json(timeout=30)["type"] in ("session.created", "transcription_session.created")


def test_a_socket_sending_audio_is_not_idle(idle_house: tuple[TestClient[Any], AppState, Clock]) -> None:
    client, state, clock = idle_house
    with client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        manual_turns(ws)
        clock.now += 59
        append(ws, voiced(0.5))
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit"}))
        until(ws, "conversation.item.input_audio_transcription.completed")
        client.blocking_portal.call(_caught_up, state.speech)
        clock.now += 59
        _expire(client, state)
        ws.send_text(json.dumps({"type": "transcription_session.update", "session": {}}))
        assert until(ws, "transcription_session.updated")[-1]["type"] == "transcription_session.updated"
    assert state.speech is not None and state.speech.expired == 0  # type: ignore[attr-defined]


def test_an_utterance_open_when_its_session_expires_is_transcribed_first(
        idle_house: tuple[TestClient[Any], AppState, Clock]) -> None:
    # A tab gone quiet mid-word (its AudioContext suspended): VAD never heard the utterance end. Its deltas had gone
    # out, and the expiry dropped the rest: no `.completed`, ever.
    client, state, clock = idle_house
    with client.websocket_connect("/v1/realtime?intent=transcription") as ws:
        ws.receive_json(timeout=30)  # created
        append(ws, voiced(1.5))
        until(ws, "input_audio_buffer.speech_started")
        client.blocking_portal.call(_caught_up, state.speech)
        clock.now += 61
        _expire(client, state)
        events = until(ws, "error")
        kinds = [e["type"] for e in events]
        assert "conversation.item.input_audio_transcription.completed" in kinds, kinds
        assert events[-1]["error"]["code"] == "session_expired"
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json(timeout=30)
    assert closed.value.code == 1000
    assert state.speech is not None and not state.speech.sessions


class _DeafClient:
    """A websocket whose client sends events as fast as it is read and reads nothing back: its sends never finish."""

    def __init__(self) -> None:
        self.scope: dict[str, Any] = {"state": {}}
        self.received = 0

    async def receive(self) -> dict[str, Any]:
        self.received += 1
        return {"type": "websocket.receive", "text": '{"type": "input_audio_buffer.commit"}'}  # an error reply each

    async def send_json(self, event: Any) -> None:
        await anyio.sleep_forever()

    async def close(self, code: int = 1000) -> None:
        pass


def test_a_client_that_reads_nothing_is_cut_off_and_not_read_without_bound(whisper_dir: Path) -> None:
    # It grew the server by ~0.7 KB a frame, never closed: replies queued behind a send that never finished.
    from service.config import ServiceConfig
    from service.limits import Limits
    from service.speech.live_socket import _MAX_OWED, LiveSocket
    from service.speech.realtime_config import RealtimeConfig

    state = install_speech(AppState(config=ServiceConfig(limits=Limits(send_timeout=0.5))),
                           SpeechConfig(model=str(whisper_dir), resident=True))
    deaf = _DeafClient()
    with TestClient(create_app(state)) as client:
        assert state.speech is not None
        socket = LiveSocket(cast(Any, deaf), state, state.speech, config=RealtimeConfig(), mode="realtime",
                            dialect="ga", frame_format=RealtimeConfig().pcm_format)

        async def serve() -> None:
            with anyio.fail_after(30):
                await socket.run()

        client.blocking_portal.call(serve)  # returns: cut off after --send-timeout
        assert deaf.received <= _MAX_OWED + 2  # then no more of its events were read
        assert not state.speech.sessions
