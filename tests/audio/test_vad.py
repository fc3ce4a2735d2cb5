"""audio/vad.py: speech runs, the min-speech rule, trimming, and the streaming gate."""

from __future__ import annotations

import numpy as np
import pytest

from audio.vad import Pause, Speech, SpeechGate, has_speech, speech_pieces, speech_segments, trim_silence
from tests.audio.conftest import SR, voiced


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
