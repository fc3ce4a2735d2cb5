"""Whisper's log-mel spectrogram in numpy, so it runs on a worker thread, off the engine thread.

The same math as mlx-whisper's `log_mel_spectrogram` (reflect-padded STFT with a periodic Hann window, power,
the librosa mel filterbank it ships, log10 floored 8 below the peak: of the whole signal, as transcribe() floors
it, where the caller knows it — tiny.en heard an 80 s file differently with each window floored below its own
peak, WER 0.32 against mlx-whisper's 0.05). mlx-whisper's version runs on MLX's CPU stream inside the engine
thread: ~25 ms per window on the H200's host, a pause for every chat stream.
"""

from __future__ import annotations

import os
from functools import lru_cache

import numpy as np

from audio.pcm import SAMPLE_RATE

__all__ = ["log_mel", "signal_ceiling", "N_FFT", "HOP_LENGTH", "N_SAMPLES", "N_FRAMES"]

# Whisper's window geometry (defined here only): 30 s windows, a 10 ms hop, 3000 mel frames.
N_FFT = 400
HOP_LENGTH = 160
N_SAMPLES = 30 * SAMPLE_RATE
N_FRAMES = N_SAMPLES // HOP_LENGTH


@lru_cache(maxsize=None)
def _filters(n_mels: int) -> np.ndarray:
    import mlx_whisper

    path = os.path.join(os.path.dirname(mlx_whisper.__file__), "assets", "mel_filters.npz")
    with np.load(path) as data:
        return np.ascontiguousarray(data[f"mel_{n_mels}"].T.astype(np.float32))  # (N_FFT // 2 + 1, n_mels)


@lru_cache(maxsize=None)
def _window() -> np.ndarray:
    return np.hanning(N_FFT + 1)[:-1].astype(np.float32)


def _log10_mel(x: np.ndarray, n_frames: int, n_mels: int) -> np.ndarray:
    """(n_frames, n_mels) log10 mel power of padded samples `x` (frame i reads x[160 i : 160 i + 400])."""
    windows = np.lib.stride_tricks.sliding_window_view(x, N_FFT)[::HOP_LENGTH][:n_frames]
    spectrum = np.fft.rfft(windows * _window(), axis=-1)
    power = (spectrum.real ** 2 + spectrum.imag ** 2).astype(np.float32)
    return np.log10(np.maximum(power @ _filters(n_mels), 1e-10))


def signal_ceiling(audio: np.ndarray, n_mels: int) -> float:
    """The peak log10 mel power of the whole signal, as mlx-whisper's transcribe() computes it (the signal and 30 s
    of zeros, reflect padded): it floors every window 8 below this peak, not below the window's own. Computed a
    window's frames at a time from slices of `audio` (memory stays one window's; no copy of the signal). Thread-safe.
    Raises ValueError as log_mel does."""
    if n_mels not in (80, 128):
        raise ValueError(f"no mel filterbank for n_mels={n_mels}")
    a = np.asarray(audio, np.float32)
    pad = N_FFT // 2
    start = np.zeros(pad + 1, np.float32)
    start[: min(len(a), pad + 1)] = a[: pad + 1]
    lead = start[1:][::-1]  # the reflection before sample 0 (samples -pad..-1)
    frames = (len(a) + pad) // HOP_LENGTH + 1  # every frame that reads a sample of the signal
    top = -10.0  # log10 of the power floor
    for f0 in range(0, frames, N_FRAMES):
        f1 = min(frames, f0 + N_FRAMES)
        lo, hi = f0 * HOP_LENGTH - pad, (f1 - 1) * HOP_LENGTH + N_FFT - pad  # the samples these frames read
        x = np.concatenate([lead[max(0, lo + pad):], a[max(0, lo):min(hi, len(a))],
                            np.zeros(max(0, hi - max(lo, len(a))), np.float32)])  # zeros after the signal
        top = max(top, float(_log10_mel(x, f1 - f0, n_mels).max()))
    return top


def log_mel(audio: np.ndarray, n_mels: int, frames: int = N_FRAMES, ceiling: float | None = None) -> np.ndarray:
    """(N_FRAMES, n_mels) float32: the log-mel of the first 30 s of `audio` (16 kHz), zero padded to 30 s as
    transcribe() pads a window, with frames past `frames` zeroed, floored 8 below `ceiling` (signal_ceiling: the
    whole signal's peak, as transcribe() floors; None: this window's own peak). Thread-safe. Raises ValueError for
    an n_mels mlx-whisper has no filterbank for."""
    if n_mels not in (80, 128):
        raise ValueError(f"no mel filterbank for n_mels={n_mels}")
    x = np.zeros(N_SAMPLES, np.float32)
    head = np.asarray(audio[:N_SAMPLES], np.float32)
    x[: len(head)] = head
    pad = N_FFT // 2
    x = np.concatenate([x[1:pad + 1][::-1], x, x[-(pad + 1):-1][::-1]])
    log = _log10_mel(x, N_FRAMES, n_mels)
    top = log.max() if ceiling is None else ceiling
    log = (np.maximum(log, top - 8.0) + 4.0) / 4.0
    out = np.zeros((N_FRAMES, n_mels), np.float32)
    keep = max(0, min(frames, N_FRAMES))
    out[:keep] = log[:keep]
    return out
