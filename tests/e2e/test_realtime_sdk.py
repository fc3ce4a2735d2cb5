"""The Realtime transcription grammar as the `openai` SDK speaks it — its beta client (`client.beta.realtime`,
transcription_session.* events) and its GA client (`client.realtime`, session.* events) — against a real
`tandem serve` subprocess with a tiny random-init Whisper; keepalive pings answered after a commit and after a
finish, with the transcript still delivered."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any, Iterator

import anyio
import numpy as np
import pytest
import websockets
from openai import AsyncOpenAI
from openai.types.beta.realtime import (
    ConversationItemCreatedEvent,
    ConversationItemInputAudioTranscriptionCompletedEvent,
    ErrorEvent,
    InputAudioBufferCommittedEvent,
    InputAudioBufferSpeechStartedEvent,
    InputAudioBufferSpeechStoppedEvent,
    TranscriptionSessionUpdatedEvent,
)
from openai.types.realtime import SessionCreatedEvent, SessionUpdatedEvent

from tests.e2e.conftest import TandemServer, start_tandem_server
from tests.fixtures.tiny_whisper import build_tiny_whisper

pytestmark = pytest.mark.anyio
SR = 24000
LIMIT = 120  # seconds; a safety net for a hung server, never a timing assertion


def voiced(seconds: float, rate: int = SR) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (((t * 150) % 1.0 - 0.5) * 0.5 * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)


def b64(x: np.ndarray) -> str:
    return base64.b64encode((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()).decode()


@pytest.fixture(scope="module")
def speech_server(tiny_llm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    whisper = build_tiny_whisper(tmp_path_factory.mktemp("tiny_whisper"))
    server = start_tandem_server(str(tiny_llm_dir), "--whisper-model", str(whisper), "--whisper-resident")
    try:
        yield server
    finally:
        server.stop()


def sdk(server: TandemServer) -> AsyncOpenAI:
    return AsyncOpenAI(api_key="unused", base_url=server.base_url, websocket_base_url=f"ws://127.0.0.1:{server.port}/v1")


async def test_the_sdk_beta_client_transcribes_an_utterance(speech_server: TandemServer) -> None:
    client = sdk(speech_server)
    with anyio.fail_after(LIMIT):
        async with client.beta.realtime.connect(model="whisper-1", extra_query={"intent": "transcription"}) as conn:
            created = json.loads(await conn.recv_bytes())
            assert created["type"] == "transcription_session.created"
            await conn.transcription_session.update(session={
                "input_audio_format": "pcm16",
                "input_audio_transcription": {"model": "whisper-1", "language": "en"},
                "turn_detection": {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                                   "silence_duration_ms": 500}})
            updated = await conn.recv()
            assert isinstance(updated, TranscriptionSessionUpdatedEvent)
            assert updated.session.turn_detection is not None and updated.session.turn_detection.silence_duration_ms == 500
            silence = np.zeros(SR // 2, np.float32)
            for chunk in np.array_split(np.concatenate([silence, voiced(1.5), silence, silence, silence]), 12):
                await conn.input_audio_buffer.append(audio=b64(chunk))
            await conn.send({"type": "input_audio_buffer.bogus"})  # unknown: an error event, the session goes on
            events: list[Any] = []
            async for event in conn:
                events.append(event)
                if isinstance(event, ConversationItemInputAudioTranscriptionCompletedEvent):
                    break
    kinds = [type(e) for e in events]
    for kind in (InputAudioBufferSpeechStartedEvent, InputAudioBufferSpeechStoppedEvent,
                 InputAudioBufferCommittedEvent, ConversationItemCreatedEvent, ErrorEvent):
        assert kind in kinds, kinds
    started = next(e for e in events if isinstance(e, InputAudioBufferSpeechStartedEvent))
    created_item = next(e for e in events if isinstance(e, ConversationItemCreatedEvent))
    done = events[-1]
    assert created_item.item.id == started.item_id == done.item_id and created_item.item.role == "user"
    assert kinds.index(InputAudioBufferCommittedEvent) < kinds.index(ConversationItemCreatedEvent)
    deltas = [e.delta for e in events if getattr(e, "type", "").endswith("transcription.delta")]
    assert done.transcript == "".join(d or "" for d in deltas)
    error = next(e for e in events if isinstance(e, ErrorEvent))
    assert error.error.code == "unknown_event" and error.error.param == "type"


async def test_the_sdk_ga_client_declares_its_session(speech_server: TandemServer) -> None:
    client = sdk(speech_server)
    with anyio.fail_after(LIMIT):
        async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
            created = await conn.recv()
            assert isinstance(created, SessionCreatedEvent) and created.session.type == "transcription"
            await conn.session.update(session={
                "type": "transcription",
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None,
                                    "transcription": {"model": "whisper-1", "language": "en"}}}})
            updated = await conn.recv()
            assert isinstance(updated, SessionUpdatedEvent)
            assert updated.session.audio is not None and updated.session.audio.input is not None
            assert updated.session.audio.input.turn_detection is None
            await conn.input_audio_buffer.append(audio=b64(voiced(1.0)))
            await conn.input_audio_buffer.commit()
            types = []
            async for event in conn:
                types.append(event.type)
                if event.type == "conversation.item.input_audio_transcription.completed":
                    break
    # OpenAI's GA events for the item: added, then done (no beta conversation.item.created)
    assert types.index("input_audio_buffer.committed") < types.index("conversation.item.added") \
        < types.index("conversation.item.done") and "conversation.item.created" not in types
    assert "input_audio_buffer.speech_started" not in types  # no VAD: the client commits


async def test_keepalive_pings_are_answered_after_a_commit(speech_server: TandemServer) -> None:
    url = f"ws://127.0.0.1:{speech_server.port}/v1/realtime?intent=transcription"
    with anyio.fail_after(LIMIT):
        async with websockets.connect(url, ping_interval=None) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(voiced(1.0))}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            for _ in range(3):
                await (await ws.ping())  # answered: the server keeps reading while it transcribes
            while (event := json.loads(await ws.recv()))["type"] != "conversation.item.input_audio_transcription.completed":
                pass


async def test_keepalive_pings_are_answered_after_finish(speech_server: TandemServer) -> None:
    url = f"ws://127.0.0.1:{speech_server.port}/v1/audio/live?rate=24000&encoding=s16le"
    with anyio.fail_after(LIMIT):
        async with websockets.connect(url, ping_interval=None) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            await ws.send((np.clip(voiced(1.0), -1, 1) * 32767).astype("<i2").tobytes())
            await ws.send(json.dumps({"type": "finish"}))
            for _ in range(3):
                await (await ws.ping())
            while (event := json.loads(await ws.recv()))["type"] != "transcript.done":
                assert event["type"] in ("transcript.partial", "session.created")
    assert event["received_seconds"] == pytest.approx(1.0, abs=0.02)


def test_dictate_streams_a_file_over_the_realtime_protocol(speech_server: TandemServer, tmp_path: Path) -> None:
    import subprocess
    import sys
    import wave

    wav = tmp_path / "take.wav"
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        silence = np.zeros(8000, np.float32)
        w.writeframes((np.concatenate([silence, voiced(1.5, 16000), silence, voiced(1.0, 16000)]) * 32767)
                      .astype("<i2").tobytes())
    before = speech_server.stats()["speech"]["scheduler"]["windows_done"]
    out = subprocess.run([sys.executable, "-m", "service.cli", "dictate", "--file", str(wav), "--server",
                          speech_server.root, "--speed", "4", "--language", "en", "--vocabulary", "Dashwood"],
                         capture_output=True, text=True, timeout=LIMIT)
    assert out.returncode == 0, out.stderr
    assert "3.5 s of audio" in out.stderr and "utterance" in out.stderr
    assert speech_server.stats()["speech"]["scheduler"]["windows_done"] > before  # the server transcribed it
    refused = subprocess.run([sys.executable, "-m", "service.cli", "dictate", "--file", str(wav), "--server",
                              speech_server.root, "--language", "xx-nope"], capture_output=True, text=True, timeout=LIMIT)
    assert refused.returncode != 0 and "language" in refused.stderr
