"""audio/vad.py: speech runs, the min-speech rule, trimming, and the streaming gate."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from audio.vad import (Pause, RunningLevel, Speech, SpeechGate, has_speech, level_gain, speech_pieces, speech_regions,
                       speech_segments, trim_silence)
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


@pytest.mark.parametrize("scale", [1.0, 0.001])  # 0.001: peaks of -72 dBFS, heard lifted
@pytest.mark.parametrize("chunk", [160, 480, 1000, 7919])
def test_chunked_pushes_give_the_same_events_as_one_push(chunk: int, scale: float) -> None:
    pcm = speechy(1) * np.float32(scale)
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


# Live audio: the gate follows the level heard so far (RunningLevel), so a quiet microphone's speech is kept while
# the room tone around it, however quiet, stays silence.

def pcm16(x: np.ndarray) -> np.ndarray:
    """As a client sends it: rounded to 16-bit steps (a quiet signal is a few steps tall)."""
    return (np.clip(np.round(x * 32767), -32768, 32767) / 32768).astype(np.float32)


def stream(gate: SpeechGate, pcm: np.ndarray, chunk: int = SR // 10) -> list[tuple[int, int]]:
    """What the gate passes on of `pcm` pushed `chunk` samples at a time, as [start, end) regions."""
    events = [ev for i in range(0, len(pcm), chunk) for ev in gate.push(pcm[i:i + chunk])]
    return speech_regions([*events, *gate.flush()])


def noise(kind: str, seconds: float, dbfs: float, seed: int = 5) -> np.ndarray:
    """`seconds` of white, pink or brown noise or mains hum (50/60 Hz with odd harmonics) at RMS `dbfs`."""
    n = int(seconds * SR)
    if kind.startswith("hum"):
        t = np.arange(n) / SR
        f = 50 if kind == "hum50" else 60
        x = np.sin(2 * np.pi * f * t) + 0.5 * np.sin(2 * np.pi * 3 * f * t) + 0.3 * np.sin(2 * np.pi * 5 * f * t)
    else:
        x = np.random.default_rng(seed).normal(0, 1, n)
        if kind != "white":
            shape = np.maximum(np.fft.rfftfreq(n), 1e-4) ** (0.5 if kind == "pink" else 1.0)
            x = np.fft.irfft(np.fft.rfft(x) / shape, n)
    return (x * (10 ** (dbfs / 20) / np.sqrt(np.mean(x ** 2)))).astype(np.float32)


def quiet_talk(peak_dbfs: float, floor_dbfs: float | None = None) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Two voiced bursts at `peak_dbfs` after 2 s, 3 s apart, over white room tone at `floor_dbfs` throughout,
    then 3 s of it; and where the bursts lie."""
    bursts = [voiced(1.5), voiced(2.0, f0=180.0)]
    scale = np.float32(10 ** (peak_dbfs / 20) / max(float(np.abs(b).max()) for b in bursts))
    parts, marks, at = [np.zeros(2 * SR, np.float32)], [], 2 * SR
    for b in bursts:
        parts += [b * scale, np.zeros(3 * SR, np.float32)]
        marks.append((at, at + len(b)))
        at += len(b) + 3 * SR
    pcm = np.concatenate(parts)
    if floor_dbfs is not None:
        pcm = pcm + noise("white", len(pcm) / SR, floor_dbfs)
    return pcm16(pcm), marks


def _covered(regions: list[tuple[int, int]], mark: tuple[int, int]) -> float:
    a, b = mark
    return sum(max(0, min(b, e) - max(a, s)) for s, e in regions) / (b - a)


@pytest.mark.parametrize("peak, floor", [(-45.0, None), (-60.0, None), (-72.0, None), (-55.0, -95.0),
                                         (-60.0, -100.0), (-60.0, -85.0)])
def test_a_quiet_microphone_is_heard_live(peak: float, floor: float | None) -> None:
    # the live gate heard speech at the audio's own level: below about -55 dBFS peak a session passed nothing
    pcm, marks = quiet_talk(peak, floor)
    regions = stream(SpeechGate(), pcm)
    assert len(regions) == 2, regions
    for mark in marks:
        assert _covered(regions, mark) >= 0.95, (mark, regions)
    # the first word starts where it does at an ordinary level (within a frame), out of digital silence too
    loud, _ = quiet_talk(-12.0, None if floor is None else floor - peak - 12.0)
    assert abs(regions[0][0] - stream(SpeechGate(), loud)[0][0]) <= 480


def _first_speech(gate: SpeechGate, pcm: np.ndarray) -> tuple[Speech, int]:
    """The first Speech the gate passes on of `pcm` pushed 10 ms at a time, and how much had been pushed."""
    for at in range(0, len(pcm), 160):
        for ev in gate.push(pcm[at:at + 160]):
            if isinstance(ev, Speech):
                return ev, at + 160
    raise AssertionError("no speech passed")


def test_the_first_sound_is_held_at_most_300_ms() -> None:
    # what the first word waits for: its first 0.3 s are judged with the level of all of them
    pcm, marks = quiet_talk(-60.0)
    first, pushed = _first_speech(SpeechGate(), pcm)
    _, pushed_plain = _first_speech(SpeechGate(gain=10.0), pcm)  # heard at a fixed level: nothing held
    assert first.start <= marks[0][0] and pushed - pushed_plain <= 0.3 * SR + 480


def test_an_ordinary_level_is_heard_as_it_is() -> None:
    pcm = speechy(2)
    assert stream(SpeechGate(), pcm) == stream(SpeechGate(gain=1.0), pcm)


@pytest.mark.parametrize("kind", ["white", "pink", "brown", "hum50", "hum60"])
def test_faint_noise_in_a_live_stream_stays_silence_however_quiet(kind: str) -> None:
    # room tone alone is lifted no higher than -62 dBFS: at -40, after digital silence ending mid-frame (a
    # microphone opening), webrtcvad passed seconds of it as speech; a few 16-bit steps tall (-100 to -90 dBFS)
    # it is a staircase, heard over dither. Every aggressiveness (the Realtime threshold) alike
    for dbfs in (-100.0, -95.0, -90.0, -80.0, -70.0, -60.0):
        for lead in (0, 8020, 8100, 8400):
            pcm = pcm16(np.concatenate([np.zeros(lead, np.float32), noise(kind, 4.0, dbfs, seed=lead)]))
            for aggressiveness in range(4):
                assert stream(SpeechGate(aggressiveness=aggressiveness), pcm) == [], (dbfs, lead, aggressiveness)


@pytest.mark.parametrize("kind", ["white", "pink", "hum50"])
def test_room_tone_after_quiet_speech_stays_silence(kind: str) -> None:
    # once the speech has left the level's window the gain climbs back, slowly, and no higher than lifting the
    # tone to -62 dBFS: climbing at once passed seconds of it as speech
    for peak, floor in ((-50.0, -90.0), (-60.0, -95.0), (-40.0, -70.0)):
        speech = voiced(2.0) * np.float32(10 ** (peak / 20) / np.abs(voiced(2.0)).max())
        pcm = noise(kind, 30.0, floor)
        pcm[2 * SR:4 * SR] += speech
        for aggressiveness in range(4):
            regions = stream(SpeechGate(aggressiveness=aggressiveness), pcm16(pcm))
            assert len(regions) == 1 and regions[0][1] <= 4 * SR + SR // 2, (peak, floor, aggressiveness, regions)


def test_a_click_does_not_hold_the_lift_down() -> None:
    # a file's loudest frame holds its gain down; a live level's 4th-loudest does, so a bump of the microphone
    # does not cost the next 10 s of quiet speech
    pcm, marks = quiet_talk(-60.0, -100.0)
    pcm[marks[0][1] + SR:marks[0][1] + SR + 32] += np.float32(0.5) * np.hanning(32).astype(np.float32)
    assert _covered(stream(SpeechGate(), pcm), marks[1]) >= 0.95


def _frame_rms(x: np.ndarray) -> np.ndarray:
    x = x[: len(x) // 480 * 480].reshape(-1, 480)
    return np.sqrt(np.mean(np.square(x, dtype=np.float64), axis=1))


def _db(x: float) -> float:
    return 20 * float(np.log10(x))


def test_the_live_level() -> None:
    # quiet speech: its 95th percentile lifted to -40 dBFS, as a file's
    rms = _frame_rms(pcm16(np.concatenate([noise("white", 1.0, -100.0), voiced(3.0) * np.float32(0.01)])))
    assert _db(float(np.percentile(rms, 95)) * RunningLevel().gains(rms)[-1]) == pytest.approx(-40.0, abs=0.5)
    # room tone alone: its 10th percentile lifted to -62 dBFS
    tone = _frame_rms(pcm16(noise("pink", 5.0, -85.0)))
    assert _db(float(np.percentile(tone, 10)) * RunningLevel().gains(tone)[-1]) == pytest.approx(-62.0, abs=0.5)
    # loud speech, then its room tone: once the speech has left the window the gain climbs, 3 dB a second at most,
    # until the tone is lifted to -62 dBFS
    after = _frame_rms(pcm16(np.concatenate([voiced(3.0) * np.float32(0.5), noise("white", 30.0, -80.0)])))
    gains = RunningLevel().gains(after)
    assert gains[100] == 1.0 and np.diff([_db(g) for g in gains]).max() <= 3.0 * 0.03 * 1.001
    assert _db(float(np.percentile(after[-300:], 10)) * gains[-1]) == pytest.approx(-62.0, abs=0.5)


def test_a_retuned_gate_ends_the_open_region_by_its_old_settings_and_the_next_by_the_new() -> None:
    # a live session's update mid-utterance: the region being spoken keeps its pause rule, the next one takes the new
    gap = np.zeros(int(0.4 * SR), np.float32)
    silence = np.zeros(SR, np.float32)
    gate = SpeechGate(min_silence_ms=500)
    events = gate.push(voiced(1.0))
    gate.retune(min_speech_ms=250, min_silence_ms=200, padding_ms=200, aggressiveness=2)
    for part in (gap, voiced(1.0), silence, voiced(1.0), gap, voiced(1.0), silence):
        events += gate.push(part)
    pauses = [round(e.at / SR, 1) for e in events if isinstance(e, Pause)]
    assert pauses == [2.7, 4.7, 6.1]  # 0.4 s bridged in the region open at the update, not in the next
    with pytest.raises(ValueError):
        gate.retune(min_speech_ms=250, min_silence_ms=200, padding_ms=200, aggressiveness=4)
