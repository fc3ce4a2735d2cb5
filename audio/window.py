"""A Whisper window in flight: what to decode (`WindowRequest`), what came out (`WindowResult`), and the scheduler's
state for it between steps (`Window`: its encoder job, its decoding row, its rung of the fallback ladder, and what a
finished row means for it: the whole window redone, the next rung, or its result)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np

from audio.decoder import DecodeRow, RowResult, detect_language, finish_row, new_row
from audio.encoder import EncoderJob

if TYPE_CHECKING:
    from audio.whisper import LoadedWhisper

__all__ = ["WindowRequest", "WindowResult", "Window", "unfed", "loops", "loop_at"]


def loops(tokens: list[int], times: int = 3, longest: int = 16, cut_from: int = 4) -> bool:
    """Whether `tokens` hold one run of 1..`longest` tokens repeated `times` times in a row ("Five. Five. Five.",
    or a sentence: "He was not an ill-disposed young man." thrice, seen at 4× real time): over a cut encoder context
    Whisper loops in runs that pass the compression threshold. The last copy of a run of at least `cut_from` tokens
    counts when at least half of it is there (the decode stopped mid-loop: "ill-disposed young man, unless to be"
    twice, then "ill-disposed young man.", seen at 4× real time on this CPU). Raises nothing."""
    return loop_at(tokens, times, longest, cut_from) is not None


def loop_at(tokens: list[int], times: int = 3, longest: int = 16, cut_from: int = 4) -> tuple[int, int] | None:
    """(start, length) of the shortest run `loops` finds in `tokens` (the earliest of that length), else None.
    Raises nothing."""
    for n in range(1, longest + 1):
        for start in range(0, len(tokens) - n * (times - 1) + 1):
            run = tokens[start:start + n]
            if not all(tokens[start + k * n:start + (k + 1) * n] == run for k in range(1, times - 1)):
                continue
            last = tokens[start + (times - 1) * n:start + times * n]
            if last == run or (n >= cut_from and 2 * len(os.path.commonprefix([last, run])) >= n):
                return start, n
    return None


@dataclass(frozen=True)
class WindowRequest:
    """One ≤ 30 s window to decode: `frames` of content in `audio` (16 kHz), mlx-whisper's decoding
    settings, and the fallback thresholds of openai-whisper's transcribe()."""

    audio: np.ndarray
    frames: int
    task: str = "transcribe"
    language: str | None = None  # None: detected from this window
    languages: tuple[str, ...] = ()  # what detection chooses among (Whisper's codes; empty: all of them)
    temperatures: tuple[float, ...] = (0.0,)
    prompt: tuple[int, ...] = ()
    prefix: tuple[int, ...] = ()  # forced start of the sampled text (committed live text)
    without_timestamps: bool = False
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    keep_features: bool = False  # word timestamps re-read the encoder output
    sample_len: int | None = None  # most tokens to sample (None: n_text_ctx / 2)
    seed: int = 0  # keys the draws of temperature-fallback rows
    realtime: bool = False  # a live session's window: its steps' share grows while it waits (catch-up)
    # Encoder positions to compute (None: the whole 30 s window; fewer: audio/encoder.fitted_context). A result
    # that fails the thresholds is redone over the whole window before the fallback ladder is climbed, unless
    # `redo_whole` is off (a live guess: the next one comes a second later, a redo would only delay it).
    audio_ctx: int | None = None
    redo_whole: bool = True
    # The log10 mel peak the window's log-mel is floored 8 below (audio/mel.signal_ceiling: the whole file's, as
    # transcribe() floors; None: the window's own, all a live session can know).
    mel_ceiling: float | None = None
    logprobs: bool = False  # keep each sampled token's log probability (RowResult.logprobs): a live session's ask

    def loops_over_cut_context(self, r: RowResult, eot: int) -> bool:
        """Over a cut encoder context, text tokens (below `eot`) repeating a short run: a failure that passes the
        compression threshold when the run is short. Raises nothing."""
        return self.audio_ctx is not None and loops([t for t in r.sampled if t < eot])

    def needs_fallback(self, r: RowResult) -> bool:
        """Too repetitive or too improbable, unless it is silence. Raises nothing."""
        if self.no_speech_threshold is not None and r.no_speech_prob > self.no_speech_threshold:
            return False
        lp = self.logprob_threshold
        return self.repetitive(r) or (lp is not None and r.avg_logprob < lp)

    def repetitive(self, r: RowResult) -> bool:
        """Over the compression threshold (a decode that loops). Raises nothing."""
        cr = self.compression_ratio_threshold
        return cr is not None and r.compression_ratio > cr


@dataclass
class WindowResult:
    decoded: RowResult
    language: str
    features: Any = None  # (1, n_audio_ctx, D) when keep_features


@dataclass(eq=False)
class Window:
    loaded: "LoadedWhisper"
    request: WindowRequest
    encoder: EncoderJob
    seq: int
    row: DecodeRow | None = None
    rung: int = 0  # index into request.temperatures
    language: str | None = None
    result: WindowResult | None = None
    error: BaseException | None = None
    cancelled: bool = False
    scope: anyio.CancelScope | None = None
    since: float = field(default_factory=time.perf_counter)  # joined the scheduler (its wait for a share)
    mel: np.ndarray | None = None  # kept while the encoder context is cut short: the whole window's redo needs it

    @property
    def finished(self) -> bool:
        return self.result is not None or self.error is not None

    @property
    def live(self) -> bool:
        """Neither finished nor given up (read on the engine thread too). Raises nothing."""
        return not (self.cancelled or self.finished or (self.scope is not None and self.scope.cancel_called))

    def start_decoding(self) -> None:
        """Its encoder is done: the language (given, English for an English-only model, else detected from its
        features among the request's languages) and the first row. Raises what MLX raises."""
        model = self.loaded.model
        self.language = self.request.language or ("en" if not model.is_multilingual else None)
        if self.language is None:
            self.language = detect_language(model, self.encoder.features, self.request.languages)
        self.row = self._new_row()

    def _new_row(self) -> DecodeRow:
        from mlx_whisper.decoding import DecodingOptions

        r = self.request
        options = DecodingOptions(task=r.task, language=self.language, temperature=r.temperatures[self.rung],
                                  prompt=list(r.prompt), without_timestamps=r.without_timestamps, fp16=self.loaded.fp16,
                                  sample_len=r.sample_len)
        assert self.encoder.cross_kv is not None
        row = new_row(self.loaded.model, options, self.encoder.cross_kv, list(r.prefix), seed=r.seed * 64 + self.rung)
        row.logprobs = [] if r.logprobs else None
        return row

    def finish_row(self) -> str:
        """Its row is done: "redo" (a cut context failed: encode the whole window), "fallback" (the next rung's
        row) or "done" (`result` set). Raises what MLX raises."""
        assert self.row is not None
        eot = self.row.task.tokenizer.eot
        decoded = finish_row(self.row)
        if self.mel is not None and (self.request.needs_fallback(decoded)
                                     or self.request.loops_over_cut_context(decoded, eot)):
            # Over a cut context Whisper can loop where the whole window would not (in short runs too, which pass
            # the compression threshold): redo it whole first.
            e = self.encoder
            self.encoder = EncoderJob(e.audio, e.frames, e.chunk, e.fp16, self.mel, numpy_math=e.numpy_math)
            self.mel, self.row = None, None
            return "redo"
        if self.request.needs_fallback(decoded) and self.rung + 1 < len(self.request.temperatures):
            self.rung += 1
            self.row = self._new_row()
            return "fallback"
        self.row = None
        features = self.encoder.features if self.request.keep_features else None
        self.encoder.features = self.encoder.cross_kv = None
        self.result = WindowResult(decoded, self.language or "en", features)
        return "done"



def unfed(w: Window) -> int:
    row = w.row
    return 0 if row is None else row.length - row.fed
