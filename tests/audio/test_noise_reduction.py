"""audio/noise_reduction.py: the high-pass filter a session's noise reduction is — hum below speech goes, speech-band
tones stay, and audio filtered a chunk at a time is the audio filtered whole."""

from __future__ import annotations

import numpy as np
import pytest

from audio.noise_reduction import KINDS, HighPass

SR = 16000


def tone(hz: float, seconds: float = 2.0) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def level_db(filtered: np.ndarray, original: np.ndarray) -> float:
    settled = slice(SR // 2, None)  # past the filter's start from rest
    return float(20 * np.log10(np.sqrt(np.mean(filtered[settled] ** 2)) / np.sqrt(np.mean(original[settled] ** 2))))


@pytest.mark.parametrize("kind", KINDS)
def test_a_low_hum_is_removed_and_a_speech_band_tone_kept(kind: str) -> None:
    hum, voice = tone(50), tone(1000)
    assert level_db(HighPass(kind)(hum), hum) < -20  # type: ignore[arg-type]
    assert abs(level_db(HighPass(kind)(voice), voice)) < 0.1  # type: ignore[arg-type]
    mixed = hum + voice
    out = HighPass(kind)(mixed)  # type: ignore[arg-type]
    assert out.dtype == np.float32 and len(out) == len(mixed)
    before, after = (np.abs(np.fft.rfft(x[SR // 2:])) for x in (mixed, out))  # 1.5 s: a bin every 2/3 Hz
    at = {hz: round(hz * 1.5) for hz in (50, 1000)}
    assert after[at[50]] < 0.1 * before[at[50]]  # the hum is gone from the mix, the tone stays
    assert after[at[1000]] == pytest.approx(before[at[1000]], rel=0.02)


def test_far_field_cuts_higher_than_near_field() -> None:
    rumble = tone(100)
    near, far = HighPass("near_field")(rumble), HighPass("far_field")(rumble)
    assert level_db(far, rumble) < level_db(near, rumble) - 6


@pytest.mark.parametrize("kind", KINDS)
def test_filtered_a_chunk_at_a_time_is_filtered_whole(kind: str) -> None:
    x = np.random.default_rng(1).normal(0, 0.2, 3 * SR).astype(np.float32) + tone(60, 3.0)
    whole = HighPass(kind)(x)  # type: ignore[arg-type]
    chunked = HighPass(kind)  # type: ignore[arg-type]
    cuts = [0, 1, 161, 4000, 4001, 20000, len(x)]  # odd sizes, one empty chunk, one of a single sample
    parts = [chunked(x[a:b]) for a, b in zip(cuts, cuts[1:])] + [chunked(x[:0])]
    np.testing.assert_allclose(np.concatenate(parts), whole, rtol=0, atol=1e-6)


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="near_field"):
        HighPass("studio")  # type: ignore[arg-type]
