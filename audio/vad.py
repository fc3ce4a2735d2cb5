"""Voice activity with webrtcvad: speech segments, a no-speech gate, and silence trimming."""

from __future__ import annotations

import numpy as np
import webrtcvad

from audio.pcm import SAMPLE_RATE

__all__ = ["speech_segments", "has_speech", "trim_silence"]

_FRAME_MS = 30
_FRAME = SAMPLE_RATE * _FRAME_MS // 1000


def _pcm16(x: np.ndarray) -> bytes:
    return (np.clip(x, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def speech_segments(pcm: np.ndarray, *, min_speech_ms: int = 250, min_silence_ms: int = 300,
                    padding_ms: int = 90, aggressiveness: int = 2) -> list[tuple[int, int]]:
    """Sample ranges [start, end) of speech in 16 kHz mono float32 `pcm`: 30 ms voiced frames merged across
    gaps shorter than `min_silence_ms`, runs shorter than `min_speech_ms` dropped, each padded by
    `padding_ms`. Raises ValueError for aggressiveness outside 0–3."""
    if not 0 <= aggressiveness <= 3:
        raise ValueError("aggressiveness must be 0–3")
    vad = webrtcvad.Vad(aggressiveness)
    n = len(pcm) // _FRAME
    if n == 0:
        return []
    data = _pcm16(pcm[: n * _FRAME])
    step = _FRAME * 2
    voiced = [vad.is_speech(data[i * step:(i + 1) * step], SAMPLE_RATE) for i in range(n)]
    runs: list[list[int]] = []
    gap_frames = max(1, min_silence_ms // _FRAME_MS)
    for i, v in enumerate(voiced):
        if not v:
            continue
        if runs and i - runs[-1][1] <= gap_frames:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    min_frames = max(1, -(-min_speech_ms // _FRAME_MS))
    pad = padding_ms * SAMPLE_RATE // 1000
    return [(max(0, a * _FRAME - pad), min(len(pcm), b * _FRAME + pad))
            for a, b in runs if b - a >= min_frames]


def has_speech(pcm: np.ndarray, *, min_speech_ms: int = 250, aggressiveness: int = 2) -> bool:
    """True when at least one speech run of `min_speech_ms` is present. Raises ValueError as above."""
    return bool(speech_segments(pcm, min_speech_ms=min_speech_ms, aggressiveness=aggressiveness))


def trim_silence(pcm: np.ndarray, *, min_speech_ms: int = 250, aggressiveness: int = 2) -> tuple[np.ndarray, int]:
    """(pcm without leading/trailing non-speech, samples cut from the start). All silence → empty array.
    Raises ValueError as above."""
    segments = speech_segments(pcm, min_speech_ms=min_speech_ms, aggressiveness=aggressiveness)
    if not segments:
        return pcm[:0], len(pcm)
    start, end = segments[0][0], segments[-1][1]
    return pcm[start:end], start
