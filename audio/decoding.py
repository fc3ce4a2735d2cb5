"""openai-whisper's transcribe() seek loop, one 30 s window per `step()` so each window is one engine task.

The window body is mlx-whisper's own machinery (log_mel_spectrogram, Whisper.decode with DecodingOptions,
add_word_timestamps); only the loop around it is inverted so the driver can interleave LLM iterations.
Not ported: beam search (mlx-whisper has none) and hallucination_silence_threshold.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from audio.pcm import SAMPLE_RATE
from audio.transcript import Segment, TranscribeOptions, Transcript, Word
from audio.whisper import LoadedWhisper

__all__ = ["WindowedTranscription", "HOP_LENGTH", "N_FRAMES", "N_SAMPLES"]

HOP_LENGTH = 160
N_SAMPLES = 30 * SAMPLE_RATE
N_FRAMES = N_SAMPLES // HOP_LENGTH
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH


def _segment_end(segments: list[dict[str, Any]]) -> float | None:
    return next((w["end"] for s in reversed(segments) for w in reversed(s.get("words", []))),
                segments[-1]["end"] if segments else None)


class WindowedTranscription:
    """Seek state over one growing or complete 16 kHz signal. `next_window` says which audio the next step
    needs; `step` decodes it (engine thread) and returns the new segments. Not thread-safe: one step at a time."""

    def __init__(self, loaded: LoadedWhisper, options: TranscribeOptions, *, time_offset: float = 0.0) -> None:
        self.loaded = loaded
        self.options = options
        self.time_offset = time_offset  # seconds added to every timestamp (vad_trim cut)
        self.seek = 0  # mel frames (10 ms) consumed so far
        self.segments: list[dict[str, Any]] = []
        self.all_tokens: list[int] = []
        self.prompt_reset_since = 0
        self.initial_prompt_tokens: list[int] = []
        self.last_speech_timestamp = 0.0
        self.windows = 0
        model = loaded.model
        self.language: str | None = options.language or (None if model.is_multilingual else "en")
        self._tokenizer: Any = None
        if self.language is not None:
            self._init_tokenizer()

    # ---- planning (event loop) -------------------------------------------------------------
    def next_window(self, total_samples: int, final: bool) -> tuple[int, int] | None:
        """(start sample, segment frames) of the next window, or None. Before `final` only full 30 s
        windows are ready. Raises nothing."""
        content_frames = total_samples // HOP_LENGTH
        remaining = content_frames - self.seek
        if remaining <= 0 or (not final and remaining < N_FRAMES):
            return None
        return self.seek * HOP_LENGTH, min(N_FRAMES, remaining)

    def skip(self, segment_frames: int) -> None:
        """Advance past a window without decoding it (VAD found no speech). Raises nothing."""
        self.seek += segment_frames

    # ---- the window (engine thread) --------------------------------------------------------
    def _init_tokenizer(self) -> None:
        from mlx_whisper.tokenizer import get_tokenizer

        model = self.loaded.model
        self._tokenizer = get_tokenizer(model.is_multilingual, num_languages=model.num_languages,
                                        language=self.language, task=self.options.task)
        if self.options.prompt and not self.initial_prompt_tokens:
            self.initial_prompt_tokens = self._tokenizer.encode(" " + self.options.prompt.strip())
            self.all_tokens.extend(self.initial_prompt_tokens)

    def _mel(self, audio: np.ndarray, segment_frames: int) -> Any:
        import mlx.core as mx
        from mlx_whisper.audio import log_mel_spectrogram, pad_or_trim

        model = self.loaded.model
        # Zero padding to a full window, as transcribe() pads the whole file: same STFT edges.
        mel = log_mel_spectrogram(audio[: N_SAMPLES], n_mels=model.dims.n_mels,
                                  padding=max(0, N_SAMPLES - len(audio)))
        dtype = mx.float16 if self.loaded.fp16 else mx.float32
        return pad_or_trim(mel[:segment_frames], N_FRAMES, axis=-2).astype(dtype)

    def _decode_with_fallback(self, mel: Any) -> Any:
        from mlx_whisper.decoding import DecodingOptions

        o = self.options
        result = None
        for t in o.temperatures:
            options = DecodingOptions(task=o.task, language=self.language, temperature=t,
                                      prompt=self.all_tokens[self.prompt_reset_since:],
                                      without_timestamps=o.without_timestamps, fp16=self.loaded.fp16)
            result = self.loaded.model.decode(mel, options)
            if not self._needs_fallback(result):
                break
        return result

    def _needs_fallback(self, result: Any) -> bool:
        o = self.options
        if o.no_speech_threshold is not None and result.no_speech_prob > o.no_speech_threshold:
            return False  # silence: a low logprob is expected
        return bool((o.compression_ratio_threshold is not None and result.compression_ratio > o.compression_ratio_threshold)
                    or (o.logprob_threshold is not None and result.avg_logprob < o.logprob_threshold))

    def _silent(self, result: Any) -> bool:
        o = self.options
        return bool(o.no_speech_threshold is not None and result.no_speech_prob > o.no_speech_threshold and not (
            o.logprob_threshold is not None and result.avg_logprob > o.logprob_threshold))

    def _new_segment(self, start: float, end: float, tokens: np.ndarray, result: Any) -> dict[str, Any]:
        token_list = [int(t) for t in tokens.tolist()]
        text_tokens = [t for t in token_list if t < self._tokenizer.eot]
        return {"seek": self.seek, "start": start, "end": end, "text": self._tokenizer.decode(text_tokens),
                "tokens": token_list, "temperature": result.temperature, "avg_logprob": result.avg_logprob,
                "compression_ratio": result.compression_ratio, "no_speech_prob": result.no_speech_prob}

    def _split(self, tokens: np.ndarray, result: Any, time_offset: float, segment_frames: int, *,
               whole: bool = False) -> tuple[list[dict[str, Any]], int, bool]:
        """Segments between timestamp pairs, the frames consumed, and whether the window ended on a single
        timestamp. An unfinished last segment is left for the next window, or kept (to the window's end)
        when `whole` (batched chunks are never revisited)."""
        tok = self._tokenizer
        input_stride = N_FRAMES // self.loaded.model.dims.n_audio_ctx
        time_precision = input_stride * HOP_LENGTH / SAMPLE_RATE
        current: list[dict[str, Any]] = []
        timestamp_tokens = tokens >= tok.timestamp_begin
        single_timestamp_ending = timestamp_tokens[-2:].tolist() == [False, True]
        consecutive = np.where(np.logical_and(timestamp_tokens[:-1], timestamp_tokens[1:]))[0] + 1
        if len(consecutive) > 0:
            slices = consecutive.tolist()
            if single_timestamp_ending:
                slices.append(len(tokens))
            last_slice = 0
            for current_slice in slices:
                sliced = tokens[last_slice:current_slice]
                start_pos = int(sliced[0]) - tok.timestamp_begin
                end_pos = int(sliced[-1]) - tok.timestamp_begin
                current.append(self._new_segment(time_offset + start_pos * time_precision,
                                                 time_offset + end_pos * time_precision, sliced, result))
                last_slice = current_slice
            if single_timestamp_ending:
                return current, segment_frames, True
            if whole and last_slice < len(tokens):
                start_pos = int(tokens[last_slice - 1]) - tok.timestamp_begin
                current.append(self._new_segment(time_offset + start_pos * time_precision,
                                                 time_offset + segment_frames * HOP_LENGTH / SAMPLE_RATE,
                                                 tokens[last_slice:], result))
                return current, segment_frames, False
            # the last segment is unfinished: continue from its start timestamp
            return current, (int(tokens[last_slice - 1]) - tok.timestamp_begin) * input_stride, False
        duration = segment_frames * HOP_LENGTH / SAMPLE_RATE
        timestamps = tokens[timestamp_tokens.nonzero()[0]]
        if len(timestamps) > 0 and int(timestamps[-1]) != tok.timestamp_begin:
            duration = (int(timestamps[-1]) - tok.timestamp_begin) * time_precision
        current.append(self._new_segment(time_offset, time_offset + duration, tokens, result))
        return current, segment_frames, single_timestamp_ending

    def step(self, audio: np.ndarray, segment_frames: int) -> list[Segment]:
        """Decode the window starting at `self.seek` (`audio` = samples from there, ≤ 30 s used) and
        advance the seek. Engine thread only. Raises whatever MLX raises (the task's awaiter gets it)."""
        from mlx_whisper.timing import add_word_timestamps

        model, o = self.loaded.model, self.options
        mel = self._mel(audio, segment_frames)
        if self.language is None:
            _, probs = model.detect_language(mel)
            self.language = max(probs, key=probs.get)
            self._init_tokenizer()
        tok = self._tokenizer
        self.windows += 1
        time_offset = float(self.seek * HOP_LENGTH / SAMPLE_RATE)

        result = self._decode_with_fallback(mel)
        tokens = np.array(result.tokens, dtype=np.int64)
        if self._silent(result):
            self.seek += segment_frames  # silent window
            return []

        previous_seek = self.seek
        current, advance, single_timestamp_ending = self._split(tokens, result, time_offset, segment_frames)
        self.seek += advance

        if o.word_timestamps:
            add_word_timestamps(segments=current, model=model, tokenizer=tok, mel=mel, num_frames=segment_frames,
                                last_speech_timestamp=self.last_speech_timestamp)
            if not single_timestamp_ending:
                last_word_end = _segment_end(current)
                if last_word_end is not None and last_word_end > time_offset:
                    self.seek = round(last_word_end * FRAMES_PER_SECOND)
            last_word_end = _segment_end(current)
            if last_word_end is not None:
                self.last_speech_timestamp = last_word_end
        if self.seek <= previous_seek:  # never loop on the same window
            self.seek = previous_seek + segment_frames
        new = self._commit(current)
        if not o.condition_on_previous_text or result.temperature > 0.5:
            self.prompt_reset_since = len(self.all_tokens)  # do not condition on text sampled hot
        return new

    def _commit(self, current: list[dict[str, Any]]) -> list[Segment]:
        for s in current:  # instantaneous or empty segments carry no text
            if s["start"] == s["end"] or not s["text"].strip():
                s["text"], s["tokens"], s["words"] = "", [], []
        first_id = len(self.segments)
        self.segments.extend(current)
        self.all_tokens.extend(t for s in current for t in s["tokens"])
        return [self._to_segment(i, s) for i, s in enumerate(current, start=first_id) if s["text"]]

    def step_batch(self, chunks: list[tuple[np.ndarray, int, int]]) -> list[Segment]:
        """Decode independent chunks — (audio, frames, start frame) each, ≤ 30 s — in ONE batched encoder and
        decoder call (mlx-whisper's DecodingTask takes a batch of mels); rows that need the temperature
        fallback are re-decoded together at the next rung. No conditioning across chunks. Engine thread only.
        Raises whatever MLX raises."""
        import mlx.core as mx
        from mlx_whisper.decoding import DecodingOptions
        from mlx_whisper.timing import add_word_timestamps

        model, o = self.loaded.model, self.options
        mels = [self._mel(audio, frames) for audio, frames, _ in chunks]
        if self.language is None:
            _, probs = model.detect_language(mels[0])
            self.language = max(probs, key=probs.get)
            self._init_tokenizer()
        batch = mx.stack(mels)
        results: list[Any] = [None] * len(chunks)
        todo = list(range(len(chunks)))
        for t in o.temperatures:
            options = DecodingOptions(task=o.task, language=self.language, temperature=t,
                                      prompt=list(self.initial_prompt_tokens), without_timestamps=o.without_timestamps,
                                      fp16=self.loaded.fp16)
            rows = batch if len(todo) == len(chunks) else batch[mx.array(todo)]
            for i, result in zip(todo, model.decode(rows, options)):
                results[i] = result
            todo = [i for i in todo if self._needs_fallback(results[i])]
            if not todo:
                break
        self.windows += 1
        new: list[Segment] = []
        for (_, frames, start), mel, result in zip(chunks, mels, results):
            if self._silent(result):
                continue
            self.seek = start  # segments record the chunk they came from
            offset = start * HOP_LENGTH / SAMPLE_RATE
            current, _, _ = self._split(np.array(result.tokens, dtype=np.int64), result, offset, frames, whole=True)
            if o.word_timestamps:
                add_word_timestamps(segments=current, model=model, tokenizer=self._tokenizer, mel=mel,
                                    num_frames=frames, last_speech_timestamp=self.last_speech_timestamp)
                self.last_speech_timestamp = _segment_end(current) or self.last_speech_timestamp
            new.extend(self._commit(current))
        self.seek = max(start + frames for _, frames, start in chunks)
        return new

    def fork(self) -> "WindowedTranscription":
        """A copy whose step() leaves this one's seek and text untouched (tentative decodes). Raises nothing."""
        clone = copy.copy(self)
        clone.segments = list(self.segments)
        clone.all_tokens = list(self.all_tokens)
        return clone

    # ---- results ---------------------------------------------------------------------------
    def _to_segment(self, i: int, s: dict[str, Any]) -> Segment:
        off = self.time_offset
        return Segment(
            id=i, seek=int(s["seek"]), start=round(float(s["start"]) + off, 3), end=round(float(s["end"]) + off, 3),
            text=s["text"], tokens=list(s["tokens"]), temperature=float(s["temperature"]),
            avg_logprob=float(s["avg_logprob"]), compression_ratio=float(s["compression_ratio"]),
            no_speech_prob=float(s["no_speech_prob"]),
            words=[Word(w["word"], round(float(w["start"]) + off, 3), round(float(w["end"]) + off, 3),
                        float(w.get("probability", 0.0))) for w in s.get("words", [])])

    def text(self) -> str:
        """All committed text so far. Raises nothing."""
        if self._tokenizer is None:
            return ""
        tokens = [t for t in self.all_tokens[len(self.initial_prompt_tokens):] if t < self._tokenizer.eot]
        return self._tokenizer.decode(tokens)

    def transcript(self, duration: float) -> Transcript:
        """The Transcript of everything decoded so far. Raises nothing."""
        kept = [s for s in self.segments if s["text"]]
        segments = [self._to_segment(i, s) for i, s in enumerate(kept)]
        return Transcript(text=self.text(), language=self.language or (self.options.language or "en"),
                          duration=duration, task=self.options.task, segments=segments)
