"""audio/decoding.py: the seek loop, one window per step, on a tiny random-init Whisper."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from audio.decoding import N_FRAMES, N_SAMPLES, WindowedTranscription
from audio.transcript import TranscribeOptions
from audio.whisper import LoadedWhisper, load_whisper

FAST = TranscribeOptions(temperatures=(0.0,), without_timestamps=True)


@pytest.fixture(scope="module")
def loaded(tiny_whisper_dir: Path) -> LoadedWhisper:
    return load_whisper(tiny_whisper_dir, dtype="float32")


def noise(seconds: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.1, int(seconds * 16000)).astype(np.float32)


def test_planning_full_windows_before_final(loaded: LoadedWhisper) -> None:
    tr = WindowedTranscription(loaded, FAST)
    assert tr.next_window(N_SAMPLES - 1, final=False) is None
    assert tr.next_window(N_SAMPLES, final=False) == (0, N_FRAMES)
    assert tr.next_window(16000 * 10, final=True) == (0, 1000)
    tr.skip(N_FRAMES)
    assert tr.next_window(N_SAMPLES + 16000, final=True) == (N_SAMPLES, 100)
    assert tr.next_window(N_SAMPLES, final=True) is None


def test_without_timestamps_each_window_advances_by_its_length(loaded: LoadedWhisper) -> None:
    pcm = noise(65)
    tr = WindowedTranscription(loaded, FAST)
    windows = []
    while (w := tr.next_window(len(pcm), final=True)) is not None:
        windows.append(w)
        tr.step(pcm[w[0]: w[0] + N_SAMPLES], w[1])
    assert windows == [(0, 3000), (480000, 3000), (960000, 500)]
    t = tr.transcript(65.0)
    assert t.language == "en" and t.duration == 65.0 and t.task == "transcribe"
    assert all(0 <= s.start <= s.end <= 65.0 + 1e-6 for s in t.segments)


def test_timestamped_decoding_never_stalls(loaded: LoadedWhisper) -> None:
    pcm = noise(6, seed=1)
    tr = WindowedTranscription(loaded, TranscribeOptions(temperatures=(0.0,)))
    seeks = []
    while (w := tr.next_window(len(pcm), final=True)) is not None:
        tr.step(pcm[w[0]: w[0] + N_SAMPLES], w[1])
        seeks.append(tr.seek)
    assert seeks == sorted(set(seeks)) and seeks[-1] >= 600


def test_prompt_tokens_prefix_but_do_not_appear_in_text(loaded: LoadedWhisper) -> None:
    tr = WindowedTranscription(loaded, TranscribeOptions(temperatures=(0.0,), without_timestamps=True, prompt="Kenobi"))
    assert tr.all_tokens == tr.initial_prompt_tokens and tr.initial_prompt_tokens
    assert "Kenobi" not in tr.text()


def test_fork_leaves_the_original_untouched(loaded: LoadedWhisper) -> None:
    pcm = noise(5)
    tr = WindowedTranscription(loaded, FAST)
    probe = tr.fork()
    probe.step(pcm, 500)
    assert probe.seek == 500 and tr.seek == 0 and tr.all_tokens == [] and tr.segments == []


def test_word_timestamps_attach_words(loaded: LoadedWhisper) -> None:
    pcm = noise(4, seed=2)
    tr = WindowedTranscription(loaded, TranscribeOptions(temperatures=(0.0,), word_timestamps=True))
    new = tr.step(pcm, 400)  # one window is enough: the random model's words seek in tiny steps
    words = [w for s in new for w in s.words]
    assert words and all(w.start <= w.end for w in words)
    assert tr.seek > 0
