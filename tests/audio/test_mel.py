"""audio/mel.py: the numpy log-mel equals mlx-whisper's, and the scheduler computes it off the engine thread
(on the H200's host mlx-whisper's costs ~25 ms of the engine thread per window, a pause for every chat stream)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from mlx_whisper.audio import log_mel_spectrogram, pad_or_trim

from audio import scheduler as scheduler_module
from audio.mel import N_FRAMES, log_mel, signal_ceiling
from audio.scheduler import WhisperScheduler
from audio.window import WindowRequest
from audio.whisper import LoadedWhisper
from tests.audio.conftest import running_tasks, voiced


@pytest.mark.parametrize(("seconds", "frames"), [(1.1, 110), (12.0, 1200), (31.0, 3000), (5.0, 3000)])
def test_equals_mlx_whispers_log_mel(seconds: float, frames: int) -> None:
    audio = voiced(seconds) + np.random.default_rng(1).normal(0, 0.01, int(seconds * 16000)).astype(np.float32)
    n = 480000
    ref = log_mel_spectrogram(audio[:n], n_mels=80, padding=max(0, n - len(audio)))
    expected = np.array(pad_or_trim(ref[:frames], N_FRAMES, axis=-2))
    ours = log_mel(audio, 80, frames)
    assert ours.shape == (N_FRAMES, 80) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, expected, atol=1e-4)
    assert not ours[frames:].any()


@pytest.mark.parametrize("samples", [0, 1, 201, 16000, 75 * 16000])
def test_the_signal_ceiling_is_the_peak_of_mlx_whispers_whole_log_mel(samples: int) -> None:
    rng = np.random.default_rng(samples)
    audio = rng.normal(0, 0.01, samples).astype(np.float32)
    audio[len(audio) * 2 // 3:] *= 20  # the loudest part after the first window
    whole = np.array(log_mel_spectrogram(audio, n_mels=80, padding=480000))
    assert signal_ceiling(audio, 80) == pytest.approx(whole.max() * 4 - 4, abs=1e-5)


def test_a_window_floored_below_the_signal_ceiling_is_the_window_transcribe_reads() -> None:
    # transcribe() slices its window out of the whole signal's log-mel, floored below the whole signal's peak: a
    # quiet first window before a loud second one is floored lower than its own peak would floor it
    audio = voiced(60) * np.where(np.arange(60 * 16000) < 30 * 16000, 0.01, 1.0).astype(np.float32)
    whole = np.array(log_mel_spectrogram(audio, n_mels=80, padding=480000))
    ours = log_mel(audio[:480000], 80, N_FRAMES, signal_ceiling(audio, 80))
    np.testing.assert_allclose(ours[:-2], whole[:N_FRAMES - 2], atol=1e-4)  # the window's last frames read past it
    assert np.abs(log_mel(audio[:480000], 80, N_FRAMES)[:-2] - whole[:N_FRAMES - 2]).max() > 0.1


def test_refuses_an_unknown_filterbank() -> None:
    with pytest.raises(ValueError, match="n_mels"):
        log_mel(np.zeros(16000, np.float32), 81)


@pytest.mark.anyio
async def test_the_scheduler_computes_it_off_the_engine_thread(tiny_whisper: LoadedWhisper,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[str] = []

    def spy(audio: np.ndarray, n_mels: int, frames: int = N_FRAMES, ceiling: float | None = None) -> np.ndarray:
        threads.append(threading.current_thread().name)
        return log_mel(audio, n_mels, frames, ceiling)

    monkeypatch.setattr(scheduler_module, "log_mel", spy)
    async with running_tasks() as tasks:
        scheduler = WhisperScheduler(tasks)
        await scheduler.decode(tiny_whisper, WindowRequest(audio=voiced(2), frames=200, language="en"))
    assert len(threads) == 1 and threads[0] not in ("test-engine", threading.main_thread().name)
