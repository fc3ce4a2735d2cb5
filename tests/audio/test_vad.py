"""audio/vad.py: speech runs, the min-speech rule, trimming, and the streaming gate."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from audio.vad import Pause, Speech, SpeechGate, has_speech, level_gain, speech_pieces, speech_segments, trim_silence
from tests.audio.conftest import SR, voiced

SAMPLES = os.environ.get("TANDEM_AUDIO_SAMPLES")


def test_silence_has_no_speech() -> None:
    assert speech_segments(np.zeros(SR * 2, np.float32)) == []
    assert not has_speech(np.zeros(SR, np.float32))


def test_a_voiced_run_between_silences_is_found() -> None:
    x = np.concatenate([np.zeros(SR), voiced(1.0), np.zeros(SR)])
    (start, end), = speech_segments(x, padding_ms=0)
    assert abs(start - SR) <= 0.1 * SR and abs(end - 2 * SR) <= 0.1 * SR  # webrtcvad hangover


def test_runs_shorter_than_min_speech_are_dropped() -> None:
    x = np.concatenate([np.zeros(SR), voiced(0.12), np.zeros(SR)])
    assert has_speech(x, min_speech_ms=60)
    assert not has_speech(x, min_speech_ms=400)


def test_trim_cuts_leading_and_trailing_silence() -> None:
    x = np.concatenate([np.zeros(2 * SR), voiced(1.0), np.zeros(SR)])
    trimmed, cut = trim_silence(x)
    assert abs(cut - 2 * SR) < 0.2 * SR
    assert 0.9 * SR < len(trimmed) < 1.4 * SR
    empty, _ = trim_silence(np.zeros(SR, np.float32))
    assert len(empty) == 0


def test_bad_aggressiveness() -> None:
    with pytest.raises(ValueError):
        speech_segments(np.zeros(SR, np.float32), aggressiveness=4)


def speechy(seed: int = 0) -> np.ndarray:
    silence = np.zeros(SR, np.float32)
    faint = np.random.default_rng(seed).normal(0, 0.003, 2 * SR).astype(np.float32)
    return np.concatenate([silence, voiced(1.5), faint, voiced(0.1), silence, voiced(2.0), voiced(0.2) * 0,
                           voiced(1.0), silence])


def test_the_gate_finds_what_speech_segments_finds() -> None:
    pcm = speechy()
    expected = speech_segments(pcm, min_speech_ms=250, min_silence_ms=500, padding_ms=200)
    assert speech_pieces(pcm, min_speech_ms=250, min_silence_ms=500, padding_ms=200) == expected
    assert len(expected) == 2  # the 0.1 s blip is dropped; the 0.2 s gap is bridged


@pytest.mark.parametrize("chunk", [160, 480, 1000, 7919])
def test_chunked_pushes_give_the_same_events_as_one_push(chunk: int) -> None:
    pcm = speechy(1)
    whole = SpeechGate()
    expected = [*whole.push(pcm), *whole.flush()]
    gate = SpeechGate()
    got: list[Speech | Pause] = []
    settled = 0
    for i in range(0, len(pcm), chunk):
        got += gate.push(pcm[i:i + chunk])
        assert settled <= gate.settled <= gate.received
        settled = gate.settled
    got += gate.flush()

    def merged(events: list[Speech | Pause]) -> list[object]:
        out: list[object] = []
        for ev in events:
            if isinstance(ev, Speech) and out and isinstance(out[-1], tuple) and out[-1][1] == ev.start:
                out[-1] = (out[-1][0], ev.end)
            else:
                out.append((ev.start, ev.end) if isinstance(ev, Speech) else ev)
        return out

    assert merged(got) == merged(expected)
    assert [e.start for e in got if isinstance(e, Speech) and e.first] == \
        [e.start for e in expected if isinstance(e, Speech) and e.first]
    assert sum(1 for e in got if isinstance(e, Speech) and e.first) == 2


def test_a_pause_comes_after_min_silence_and_faint_noise_never_passes() -> None:
    gate = SpeechGate(min_silence_ms=500)
    events = gate.push(voiced(1.0))
    assert events and all(isinstance(e, Speech) for e in events) and events[0].first
    assert not any(isinstance(e, Pause) for e in gate.push(np.zeros(int(0.3 * SR), np.float32)))  # not yet
    tail = gate.push(np.zeros(int(0.4 * SR), np.float32))
    assert isinstance(tail[-1], Pause) and tail[-1].at == tail[-2].end
    noise = np.random.default_rng(2).normal(0, 0.003, 65 * SR).astype(np.float32)
    quiet = SpeechGate()
    assert [*quiet.push(noise), *quiet.flush()] == []
    assert quiet.settled >= len(noise) - SR  # all of it is known silence


def _kept(pieces: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in pieces)


def test_quiet_speech_in_a_whole_signal_is_judged_as_if_it_were_louder() -> None:
    # webrtcvad's verdict follows the absolute level: speech peaking below about -55 dBFS passed no frame, so a
    # quiet file came back "" with VAD on while Whisper read it well with VAD off
    loud = np.concatenate([np.zeros(SR, np.float32), voiced(2.0), np.zeros(SR, np.float32)])
    assert level_gain(loud) == 1.0  # an ordinary level is cut as before
    for scale in (0.01, 0.001):  # peaks of -32 and -52 dBFS (the sawtooth peaks at -12)
        quiet = loud * np.float32(scale)
        pieces = speech_pieces(quiet)
        assert len(pieces) == 1 and _kept(pieces) >= 0.9 * _kept(speech_pieces(loud)), (scale, pieces)
        assert speech_segments(quiet) and has_speech(quiet)
    assert speech_pieces(np.zeros(3 * SR, np.float32)) == []


@pytest.mark.parametrize("std", [0.0003, 0.003, 0.01])
def test_faint_noise_in_a_whole_signal_stays_silence_however_quiet(std: float) -> None:
    rng = np.random.default_rng(3)
    white = rng.normal(0, std, 65 * SR).astype(np.float32)
    pink = np.fft.irfft(np.fft.rfft(white) / np.sqrt(np.maximum(np.fft.rfftfreq(len(white)), 1e-4)), len(white))
    pink = (pink * (std / pink.std())).astype(np.float32)
    for noise in (white, pink):
        if std < 0.01:
            assert level_gain(noise) > 1.0  # lifted toward -40 dBFS, and still not speech
        assert speech_pieces(noise) == [] and speech_segments(noise) == []


def test_loud_speech_in_quiet_room_tone_keeps_its_level() -> None:
    # the level is a high percentile of the frames, held down by the loudest: sparse speech is not over-driven
    rng = np.random.default_rng(4)
    pcm = rng.normal(0, 0.0005, 60 * SR).astype(np.float32)
    pcm[30 * SR:32 * SR] += voiced(2.0)
    assert level_gain(pcm) < 1.5
    assert len(speech_pieces(pcm)) == 1


@pytest.mark.skipif(not SAMPLES, reason="TANDEM_AUDIO_SAMPLES is not set (speech samples with references)")
def test_real_speech_at_a_whisper_is_kept() -> None:
    from audio.pcm import load_audio_file

    wavs = sorted(Path(SAMPLES or ".").glob("*.wav"))
    assert wavs, f"no .wav samples in {SAMPLES}"
    for wav in wavs:
        x = load_audio_file(wav)
        quiet = x * np.float32(10 ** (-58 / 20) / np.abs(x).max())  # peak -58 dBFS: the probe's "" case
        assert _kept(speech_pieces(quiet)) >= 0.85 * _kept(speech_pieces(x)), wav.name
