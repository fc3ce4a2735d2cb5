"""Voice activity with webrtcvad: speech segments, a no-speech gate, silence trimming, and a streaming gate
that lets only speech through to Whisper."""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import webrtcvad

from audio.pcm import SAMPLE_RATE

__all__ = ["speech_segments", "has_speech", "trim_silence", "Speech", "Pause", "SpeechGate", "speech_pieces",
           "speech_regions", "level_gain", "RunningLevel"]

_FRAME_MS = 30
_FRAME = SAMPLE_RATE * _FRAME_MS // 1000
# What webrtcvad hears of a quiet recording is lifted to here (the 95th percentile of its frames' RMS). Its verdict
# follows the absolute level: speech peaking at -58 dBFS passed no frame; at -40 dBFS RMS white, pink and brown
# noise and mains hum still pass none (white noise flips near -28 dBFS), while the speech samples pass 75-92 %.
_LEVEL_TARGET = 10 ** (-40 / 20)
_LEVEL_CEILING = 10 ** (-20 / 20)  # nor is any frame lifted past this: a click or sparse loud speech holds it down
_SILENT_FRAME = 1 / 32768  # a frame under one 16-bit step: digital silence, left out of the level
# A live gate's level, not known in advance: the file rule over the last 10 s heard that is not digital silence
# (which says nothing of a microphone's level), the frame being judged included, with changes. Its ceiling holds
# for the 4th-loudest frame, so a click does not hold the lift down for 10 s as it does a file's.
_LIVE_WINDOW = 10_000 // _FRAME_MS
_LIVE_CEILING_RANK = 4
# The room tone (the 10th percentile) is lifted no higher than -62 dBFS: lifted to -40 (noise alone in the window,
# before the first word), webrtcvad passed seconds of it as speech where it began after digital silence, as when a
# microphone opens. Speech 22 dB over its room tone still reaches -40 dBFS.
_LIVE_FLOOR = 10 ** (-62 / 20)
_LIVE_FLOOR_PERCENTILE = 0.1
# The gain falls at once but climbs at most 3 dB a second (webrtcvad's noise tracker lags a rising level: climbing
# back at once when speech left the window passed seconds of the room tone after it), except over the first second
# heard, so that the first word is lifted as it begins.
_LIVE_RISE_DB = 3.0
_LIVE_SETTLING = 1000 // _FRAME_MS
# The first 300 ms of sound are judged with the level of all of them (held that long): by the level of its first
# frames alone, a word straight out of digital silence lost its first 0.3 s to the room tone rule.
_LIVE_HOLD = 300 // _FRAME_MS
_BLOCK = 60 * SAMPLE_RATE // _FRAME * _FRAME  # whole signals are read a minute at a time (bounded temporaries)


def _pcm16(x: np.ndarray, gain: float = 1.0) -> bytes:
    return (np.clip(x * gain if gain != 1.0 else x, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


# One 16-bit step of noise under what webrtcvad hears of lifted live audio: lifted 30 dB, a signal a few steps tall
# (brown noise at -90 dBFS) became a staircase it called speech, and so did the rest of a signal heard between
# frames of digital silence. A fixed table indexed by frame, so a stream is heard the same however it is chunked.
_DITHER = np.random.default_rng(0).normal(0.0, 1 / 32768, (64, _FRAME)).astype(np.float32)


def _pcm16_lifted(frames: np.ndarray, gains: np.ndarray, first: int) -> bytes:
    """16-bit PCM of `frames` (n, _FRAME) as webrtcvad hears them, each scaled by its gain over dither where it is
    lifted; `first`: the stream's index of the first frame."""
    rows = np.flatnonzero(gains > 1.0)
    if len(rows):
        frames = frames.copy()
        frames[rows] = (frames[rows] + _DITHER[(first + rows) % len(_DITHER)]) * gains[rows, None]
    return (np.clip(frames, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def level_gain(pcm: np.ndarray) -> float:
    """The gain (>= 1) that brings a quiet whole signal up to where webrtcvad hears speech, for its decision only
    (Whisper gets the audio as it is; it reads quiet speech well). 1.0 for audio at an ordinary level, so those
    files are cut as before; silence and faint noise stay below the level webrtcvad calls speech. Live audio,
    whose level is not known ahead: `RunningLevel`. Raises nothing."""
    n = len(pcm) // _FRAME
    if n == 0:
        return 1.0
    rms = np.concatenate([np.sqrt(np.mean(np.square(pcm[i:min(i + _BLOCK, n * _FRAME)].reshape(-1, _FRAME),
                                                    dtype=np.float64), axis=1))
                          for i in range(0, n * _FRAME, _BLOCK)])
    heard = rms[rms > _SILENT_FRAME]
    if heard.size == 0:
        return 1.0
    gain = min(_LEVEL_TARGET / float(np.percentile(heard, 95)), _LEVEL_CEILING / float(heard.max()))
    return max(1.0, gain)


class RunningLevel:
    """The gain for what webrtcvad hears of live audio, frame by frame, from the last `_LIVE_WINDOW` frames that
    are not digital silence (the current one included): `level_gain`'s rule (the 95th percentile lifted to -40
    dBFS; under one 16-bit step counts as one step) with its ceiling on the 4th-loudest frame, the 10th
    percentile lifted no higher than -62 dBFS; falling at once, climbing at most `_LIVE_RISE_DB` a second once a
    second has been heard. Causal: it waits for no audio ahead, so neither does the first word. Not thread-safe."""

    def __init__(self) -> None:
        self._order: deque[float] = deque()
        self._sorted: list[float] = []
        self._rise = 10 ** (_LIVE_RISE_DB * _FRAME_MS / 1000 / 20)
        self._gain = 0.0  # none yet: nothing but digital silence heard

    def gains(self, rms: np.ndarray) -> np.ndarray:
        """One gain (>= 1) per frame of RMS `rms`, in order, each heard into the level first. Raises nothing."""
        out = np.ones(len(rms), np.float32)
        for i, r in enumerate(rms.tolist()):
            if r > 0.0:  # digital silence is heard with the others' gain
                if len(self._order) == _LIVE_WINDOW:
                    del self._sorted[bisect.bisect_left(self._sorted, self._order.popleft())]
                self._order.append(r)
                bisect.insort(self._sorted, r)
                loud = self._sorted[-min(_LIVE_CEILING_RANK, len(self._sorted))]
                target = max(1.0, min(_LEVEL_TARGET / self._percentile(0.95), _LEVEL_CEILING / loud,
                                      _LIVE_FLOOR / self._percentile(_LIVE_FLOOR_PERCENTILE)))
                settling = len(self._order) < _LIVE_SETTLING
                self._gain = target if settling else min(target, self._gain * self._rise)
            out[i] = max(1.0, self._gain)
        return out

    def _percentile(self, q: float) -> float:
        # numpy's linear percentile, as level_gain takes it
        s = self._sorted
        pos = q * (len(s) - 1)
        lo = int(pos)
        value = s[lo] if lo + 1 == len(s) else s[lo] + (s[lo + 1] - s[lo]) * (pos - lo)
        return max(value, _SILENT_FRAME)


def speech_segments(pcm: np.ndarray, *, min_speech_ms: int = 250, min_silence_ms: int = 300,
                    padding_ms: int = 90, aggressiveness: int = 2) -> list[tuple[int, int]]:
    """Sample ranges [start, end) of speech in 16 kHz mono float32 `pcm`: 30 ms voiced frames merged across
    gaps shorter than `min_silence_ms`, runs shorter than `min_speech_ms` dropped, each padded by
    `padding_ms`. A quiet signal is judged as if it were louder (`level_gain`). Raises ValueError for
    aggressiveness outside 0–3."""
    if not 0 <= aggressiveness <= 3:
        raise ValueError("aggressiveness must be 0–3")
    vad = webrtcvad.Vad(aggressiveness)
    n = len(pcm) // _FRAME
    if n == 0:
        return []
    gain = level_gain(pcm)
    step = _FRAME * 2
    voiced: list[bool] = []
    for start in range(0, n * _FRAME, _BLOCK):
        data = _pcm16(pcm[start:min(start + _BLOCK, n * _FRAME)], gain)
        voiced += [vad.is_speech(data[i:i + step], SAMPLE_RATE) for i in range(0, len(data), step)]
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


@dataclass(frozen=True)
class Speech:
    """Settled speech audio: samples [start, end) (absolute) go to Whisper."""

    start: int
    end: int
    first: bool = False  # the first piece of a speech region


@dataclass(frozen=True)
class Pause:
    """A speech region ended at sample `at` and at least min_silence followed: an utterance boundary."""

    at: int


class SpeechGate:
    """Streaming speech regions on a fixed 30 ms frame grid, the same regions speech_segments finds in the
    whole signal: push audio as it arrives and get back settled Speech pieces (padded, gaps shorter than
    `min_silence_ms` kept) and Pauses. A run shorter than `min_speech_ms` never passes. `gain` scales what
    webrtcvad hears, never the audio passed on: a whole file's `level_gain`, or None (live audio) for a gain that
    follows the level heard so far (`RunningLevel`), so a quiet microphone's speech is kept. Not thread-safe."""

    def __init__(self, *, min_speech_ms: int = 250, min_silence_ms: int = 500, padding_ms: int = 200,
                 aggressiveness: int = 2, gain: float | None = None) -> None:
        if not 0 <= aggressiveness <= 3:
            raise ValueError("aggressiveness must be 0–3")
        self._vad = webrtcvad.Vad(aggressiveness)
        self._next: tuple[int, int, int, int] | None = None  # settings asked for while a region was open (retune)
        self._gain = 1.0 if gain is None else gain
        self._level = RunningLevel() if gain is None else None
        self._holding = self._level is not None  # the first sound is held until its level is known
        self._held = np.zeros((0, _FRAME), np.float32)
        self._held_gains = np.zeros(0, np.float32)
        self._gap = max(1, min_silence_ms // _FRAME_MS)
        self._min = max(1, -(-min_speech_ms // _FRAME_MS))
        self._pad = padding_ms * SAMPLE_RATE // 1000
        self._tail = np.zeros(0, np.float32)
        self.frames = 0  # frames classified
        self.received = 0  # samples pushed
        self._first: int | None = None  # first voiced frame of the open region
        self._last = 0  # last voiced frame of the open region
        self._emitted = 0  # samples passed on so far (absolute end of the last Speech)
        self.in_speech = False  # the open region has passed min_speech
        self._fresh = False  # the next Speech starts a region

    @property
    def settled(self) -> int:
        """Samples whose fate is known (passed on, or silence that never will be). Raises nothing."""
        if self._first is None:
            return max(self._emitted, self.frames * _FRAME - self._pad)
        return self._emitted if self.in_speech else max(self._emitted, self._first * _FRAME - self._pad)

    def retune(self, *, min_speech_ms: int, min_silence_ms: int, padding_ms: int, aggressiveness: int) -> None:
        """New settings for the speech regions that begin from here (a live session's update): a region open now
        ends by the settings it began with. The level heard so far is kept. Raises ValueError as __init__."""
        if not 0 <= aggressiveness <= 3:
            raise ValueError("aggressiveness must be 0–3")
        self._next = (min_speech_ms, min_silence_ms, padding_ms, aggressiveness)
        if self._first is None:
            self._take_next()

    def _take_next(self) -> None:
        if self._next is None:
            return
        # audio before the settled point may be gone already: a longer padding must not reach back into it
        self._emitted = self.settled
        min_speech_ms, min_silence_ms, padding_ms, aggressiveness = self._next
        self._next = None
        self._vad.set_mode(aggressiveness)
        self._gap = max(1, min_silence_ms // _FRAME_MS)
        self._min = max(1, -(-min_speech_ms // _FRAME_MS))
        self._pad = padding_ms * SAMPLE_RATE // 1000

    def push(self, pcm: np.ndarray) -> list[Speech | Pause]:
        """Classify the complete frames in `pcm` (16 kHz float32, continuing the stream). Raises nothing."""
        self.received += len(pcm)
        data = np.concatenate([self._tail, pcm]) if len(self._tail) else pcm
        n = len(data) // _FRAME
        self._tail = data[n * _FRAME:].copy()
        out: list[Speech | Pause] = []
        if self._level is None:
            self._classify(_pcm16(data[: n * _FRAME], self._gain), n, out)
            return self._passed_on(out)
        frames = data[: n * _FRAME].reshape(n, _FRAME)
        rms = np.sqrt(np.mean(np.square(frames, dtype=np.float64), axis=1))
        gains = self._level.gains(rms)
        if self._holding:
            if not len(self._held):  # digital silence before the first sound is judged as it comes
                sound = np.flatnonzero(rms > 0.0)
                cut = int(sound[0]) if len(sound) else n
                self._classify(_pcm16_lifted(frames[:cut], gains[:cut], self.frames), cut, out)
                frames, gains = frames[cut:], gains[cut:]
            frames = np.concatenate([self._held, frames])
            gains = np.concatenate([self._held_gains, gains])
            if len(frames) < _LIVE_HOLD:
                self._held, self._held_gains = frames, gains
                return out
            gains[:_LIVE_HOLD] = gains[_LIVE_HOLD - 1]
            self._holding = False
            self._held = self._held[:0]
        self._classify(_pcm16_lifted(frames, gains, self.frames), len(frames), out)
        return self._passed_on(out)

    def flush(self) -> list[Speech | Pause]:
        """End of stream: close the open region (padded to what arrived). Raises nothing."""
        out: list[Speech | Pause] = []
        if len(self._held):  # less than the hold came: judged with the level of all of it
            gains = np.full(len(self._held), self._held_gains[-1], np.float32)
            self._classify(_pcm16_lifted(self._held, gains, self.frames), len(self._held), out)
            self._held, self._holding = self._held[:0], False
        if self._first is not None:
            self._close(out, end_limit=self.received)
        return out

    def _classify(self, raw: bytes, n: int, out: list[Speech | Pause]) -> None:
        step = _FRAME * 2
        for i in range(n):
            self._frame(self._vad.is_speech(raw[i * step:(i + 1) * step], SAMPLE_RATE), out)

    def _passed_on(self, out: list[Speech | Pause]) -> list[Speech | Pause]:
        if self.in_speech:  # voiced so far: pass it on without waiting for the region to end
            self._emit((self._last + 1) * _FRAME, out)
        return out

    def _frame(self, voiced: bool, out: list[Speech | Pause]) -> None:
        f = self.frames
        self.frames += 1
        if voiced:
            if self._first is None:
                self._first = f
            self._last = f
            if not self.in_speech and f + 1 - self._first >= self._min:
                self.in_speech = True
                self._emitted = max(self._emitted, self._first * _FRAME - self._pad)
                self._fresh = True
        elif self._first is not None and f - self._last > self._gap:
            self._close(out, end_limit=self.frames * _FRAME)

    def _close(self, out: list[Speech | Pause], end_limit: int) -> None:
        if self.in_speech:
            end = min(end_limit, (self._last + 1) * _FRAME + self._pad)
            self._emit(end, out)
            out.append(Pause(self._emitted))
        self._first = None
        self.in_speech = False
        self._take_next()

    def _emit(self, end: int, out: list[Speech | Pause]) -> None:
        if end > self._emitted:
            out.append(Speech(self._emitted, end, self._fresh))
            self._emitted = end
            self._fresh = False


def speech_pieces(pcm: np.ndarray, **gate: int) -> list[tuple[int, int]]:
    """The SpeechGate's regions over a whole signal, as [start, end) sample ranges; a quiet signal is judged
    as if it were louder (`level_gain`: speech at -58 dBFS was all dropped). Raises ValueError for a bad
    aggressiveness."""
    g = SpeechGate(**gate, gain=level_gain(pcm))
    events = [ev for start in range(0, len(pcm), _BLOCK) for ev in g.push(pcm[start:start + _BLOCK])]
    return speech_regions([*events, *g.flush()])


def speech_regions(events: Iterable[Speech | Pause]) -> list[tuple[int, int]]:
    """A gate's Speech events as [start, end) sample ranges, touching ones joined. Raises nothing."""
    regions: list[tuple[int, int]] = []
    for ev in events:
        if isinstance(ev, Speech):
            if regions and regions[-1][1] == ev.start:
                regions[-1] = (regions[-1][0], ev.end)
            else:
                regions.append((ev.start, ev.end))
    return regions
