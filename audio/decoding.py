"""openai-whisper's transcribe() seek loop, inverted: the caller asks which window comes next, the window is
decoded among all others in flight (audio/scheduler.py), and the result advances the seek.

The decision logic is transcribe()'s own — temperature fallback, no-speech skip, segments between timestamp
pairs, seeking to the last complete segment, conditioning on previous text — plus three changes: segment
times are clamped to the window's audio, times are mapped through a Timeline when Whisper sees only
the speech pieces, and with `break_gap` the conditioning begins anew where speech resumes after a long removed
silence. Not ported: beam search (mlx-whisper has none) and hallucination_silence_threshold; of the
latter only its anomaly score, for the one window that word timestamps add before silence (see step).
"""

from __future__ import annotations

import functools
import secrets
from typing import TYPE_CHECKING, Any, Sequence

import anyio
import numpy as np

from audio.mel import HOP_LENGTH, N_FRAMES, N_SAMPLES
from audio.pcm import SAMPLE_RATE
from audio.repeats import copied_words
from audio.token_logprobs import kept_logprobs, token_logprobs
from audio.window import WindowRequest, WindowResult
from audio.timeline import Timeline
from audio.transcript import Segment, TokenCounts, TranscribeOptions, Transcript, Word
from audio.whisper import LoadedWhisper
from audio.word_timing import CachedAudio, hallucinated_tail, nest, within

if TYPE_CHECKING:
    from audio.scheduler import WhisperScheduler
    from engine.tasks import ExecutionTasks

__all__ = ["WindowedTranscription", "HOP_LENGTH", "N_FRAMES", "N_SAMPLES", "tokenizer_for", "segment_end",
           "kept_logprobs"]

FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH
# How far past a cut in the speech-only signal a segment time may run and still be taken for the speech before it
# (Whisper's segment ends run 0.1-0.3 s long): see Timeline.span.
SPAN_GRACE_S = 0.5
# A window whose text runs this many words of its prompt in order copied it (see step).
COPIED_PROMPT_WORDS = 8


def tokenizer_for(loaded: LoadedWhisper, language: str | None, task: str) -> Any:
    """mlx-whisper's tokenizer (cached per arguments). Pure Python: call it off the engine thread. Raises nothing."""
    from mlx_whisper.tokenizer import get_tokenizer

    model = loaded.model
    return get_tokenizer(model.is_multilingual, num_languages=model.num_languages, language=language or "en", task=task)


def segment_end(segments: list[dict[str, Any]]) -> float | None:
    return next((w["end"] for s in reversed(segments) for w in reversed(s.get("words", []))),
                segments[-1]["end"] if segments else None)


def _prompt_tokens(tok: Any, prompt: str | None) -> list[int]:
    # a prompt is text: "<|endoftext|>" in it is those characters, never the special token (tiktoken refuses)
    return tok.encode(" " + prompt.strip(), disallowed_special=()) if prompt and prompt.strip() else []


class WindowedTranscription:
    """Seek state over one growing or complete 16 kHz signal. Build with `start` (tokenizes the prompt off the
    engine thread). Not thread-safe: one window at a time."""

    def __init__(self, loaded: LoadedWhisper, options: TranscribeOptions, tokenizer: Any,
                 prompt_tokens: list[int], *, timeline: Timeline | None = None, carry_prompt: bool = False,
                 seed: int | None = None) -> None:
        self.loaded = loaded
        self.options = options
        self.tokenizer = tokenizer
        self.timeline = timeline
        self.seek = 0  # mel frames (10 ms) consumed so far
        self.segments: list[dict[str, Any]] = []
        self.initial_prompt_tokens = list(prompt_tokens)
        self.all_tokens: list[int] = list(prompt_tokens)
        self.text_from = len(prompt_tokens)  # all_tokens from here on are decoded text (the prompt before it)
        self.prompt_reset_since = 0
        self.last_speech_timestamp = 0.0
        # The seek went to an aligned word's end before the window's last timestamp: the next window starts inside
        # the text already written (word timestamps only; see step).
        self.inside_text = False
        self.windows = 0
        self.mel_ceiling: float | None = None  # the whole signal's log-mel peak, where it is known (a file)
        # Every conditioned window gets the client's prompt, also after a reset (a live session: see request).
        # Off, as in Whisper's transcribe(): the prompt conditions the windows until the first reset.
        self.carry_prompt = carry_prompt
        self.language: str | None = options.language or (None if loaded.model.is_multilingual else "en")
        # Keys the sampled (temperature > 0) draws of all its windows: fresh a transcription (None), else a request
        # at temperature 1 gave the same text every time. Greedy rows never read it: temperature 0 stays exact.
        self.seed = secrets.randbits(32) if seed is None else seed
        # Seconds of removed silence a window may not span (files): one window read the speech on both sides of
        # 45 s of silence as one segment, an SRT cue over the silence. None: windows span any gap (live sessions).
        self.break_gap: float | None = None
        # all_tokens' length where the last break began the conditioning anew (see step): until a reset moves past
        # it, the windows are conditioned as a new file's, on the client's prompt and then their own text.
        self.restarted_at: int | None = None

    @classmethod
    async def start(cls, loaded: LoadedWhisper, options: TranscribeOptions, *,
                    timeline: Timeline | None = None, carry_prompt: bool = False,
                    seed: int | None = None) -> "WindowedTranscription":
        """Tokenizer and prompt tokens are built in a worker thread: a long prompt never holds the engine
        thread or the event loop. `seed`: the sampled draws' key (None: a fresh one). Raises nothing of its own."""

        def prepare() -> tuple[Any, list[int]]:
            tok = tokenizer_for(loaded, options.language, options.task)
            return tok, _prompt_tokens(tok, options.prompt)

        tok, prompt = await anyio.to_thread.run_sync(prepare)
        return cls(loaded, options, tok, prompt, timeline=timeline, carry_prompt=carry_prompt, seed=seed)

    def retarget(self, options: TranscribeOptions) -> None:
        """Decode the windows from here with `options`' language and prompt (a live session's update; the earlier
        text conditions them unless the language, or those it may be in, changed: then it is detected anew). The
        prompt is bounded (MAX_PROMPT_CHARS): tokenized here in well under a millisecond. Raises nothing."""
        if (options.language, options.languages) != (self.options.language, self.options.languages):
            self.language = options.language or (None if self.loaded.model.is_multilingual else "en")
            self.tokenizer = tokenizer_for(self.loaded, options.language, options.task)
            self.prompt_reset_since = len(self.all_tokens)
        self.options = options
        self.initial_prompt_tokens = _prompt_tokens(self.tokenizer, options.prompt)

    @property
    def input_stride(self) -> int:
        """Mel frames per encoder position (a timestamp token's step is this many hops). Raises nothing."""
        return N_FRAMES // self.loaded.model.dims.n_audio_ctx

    # ---- planning ---------------------------------------------------------------------------
    def next_window(self, total_samples: int, final: bool) -> tuple[int, int] | None:
        """(start sample, content frames) of the next window, or None. Before `final` only full 30 s
        windows are ready. With `break_gap`, a window ends where speech resumes after a removed silence that long,
        as Whisper's clip_timestamps end windows. Raises nothing."""
        remaining = total_samples // HOP_LENGTH - self.seek
        if remaining <= 0 or (not final and remaining < N_FRAMES):
            return None
        frames = min(N_FRAMES, remaining)
        if self.break_gap is not None and self.timeline is not None:
            cut = self.timeline.next_break(self.seek * HOP_LENGTH, self.break_gap * SAMPLE_RATE)
            if cut is not None:
                frames = min(frames, max(1, cut // HOP_LENGTH - self.seek))
        return self.seek * HOP_LENGTH, frames

    def skip(self, segment_frames: int) -> None:
        """Advance past a window without decoding it. Raises nothing."""
        self.seek += segment_frames
        self.inside_text = False

    def at_break(self) -> bool:
        """Whether the window at the seek starts where speech resumes after a removed silence of `break_gap` or more
        (next_window ends the window before there, so the seek lands on it, floored to a frame). Raises nothing."""
        if self.break_gap is None or self.timeline is None:
            return False
        start = self.seek * HOP_LENGTH
        cut = self.timeline.next_break(start - 1, self.break_gap * SAMPLE_RATE)
        return cut is not None and cut - start < HOP_LENGTH

    def request(self, audio: np.ndarray, frames: int, *, prefix: list[int] | tuple[int, ...] = (),
                conditioned: bool = True, tokens_per_second: float | None = None,
                fallback: bool = True, realtime: bool = False) -> WindowRequest:
        """The decode request for the window at the seek: prompt = previous text since the last reset (or only
        the initial prompt when not `conditioned`; with `carry_prompt`, or from a break until the next reset, the
        initial prompt and then the text since the last reset), cut to what fits beside `prefix`. `tokens_per_second`
        caps the sampled tokens by the window's length (a looping decode stops early); without `fallback`
        only the first temperature is tried; `realtime` marks a live session's window (its wait makes speech catch
        up: audio/scheduler.py). Raises nothing."""
        o = self.options
        # mlx-whisper keeps the last n_ctx/2 - 1 prompt tokens; a forced prefix takes its room first.
        room = self.loaded.model.dims.n_text_ctx // 2 - 1 - len(prefix)
        initial = self.initial_prompt_tokens
        if not conditioned:
            prompt = initial
        elif self.carry_prompt or self.prompt_reset_since == self.restarted_at:
            # openai-whisper's carry_initial_prompt: the client's prompt before every window, the earlier text
            # since the last reset after it, cut from the left to fit (a file's windows from a break: as its first)
            earlier = self.all_tokens[max(self.prompt_reset_since, self.text_from):]
            prompt = initial + earlier[max(0, len(earlier) - max(0, room - len(initial))):]
        else:
            prompt = self.all_tokens[self.prompt_reset_since:]
        prompt = prompt[-room:] if room > 0 else []
        sample_len = None
        if tokens_per_second is not None:
            # mlx-whisper keeps only the last n_ctx/2 - sample_len prefix tokens: leave room for all of them
            sample_len = max(1, min(self.loaded.model.dims.n_text_ctx // 2 - len(prefix),
                                    16 + int(tokens_per_second * frames / 100)))
        return WindowRequest(audio=audio, frames=frames, task=o.task, language=self.language, languages=o.languages,
                             temperatures=o.temperatures if fallback else o.temperatures[:1], prompt=tuple(prompt),
                             prefix=tuple(prefix), sample_len=sample_len,
                             without_timestamps=o.without_timestamps,
                             compression_ratio_threshold=o.compression_ratio_threshold,
                             logprob_threshold=o.logprob_threshold, no_speech_threshold=o.no_speech_threshold,
                             keep_features=o.word_timestamps, realtime=realtime, mel_ceiling=self.mel_ceiling,
                             seed=self.seed, logprobs=o.logprobs)

    def adopt(self, result: WindowResult) -> None:
        """Take the language a window detected. Raises nothing."""
        if self.language is None:
            self.language = result.language
            self.tokenizer = tokenizer_for(self.loaded, self.language, self.options.task)

    def silent(self, result: WindowResult) -> bool:
        """transcribe()'s no-speech skip. Raises nothing."""
        o, d = self.options, result.decoded
        return bool(o.no_speech_threshold is not None and d.no_speech_prob > o.no_speech_threshold and not (
            o.logprob_threshold is not None and d.avg_logprob > o.logprob_threshold))

    # ---- the seek loop ----------------------------------------------------------------------
    async def step(self, audio: np.ndarray, frames: int, scheduler: "WhisperScheduler",
                   tasks: "ExecutionTasks") -> list[Segment]:
        """Decode the window at the seek (`audio` = samples from there) and advance. Raises what the
        scheduler raises."""
        if self.at_break():
            # Speech after a long removed silence (another speaker, topic or take) is conditioned as a new file's:
            # on the card names before it, tiny.en wrote " 7 of clubs." thrice over a LibriVox sentence (its
            # thresholds passed: logprob -0.67, compression 1.5), and every sentence after it went the same way.
            self.prompt_reset_since = self.restarted_at = len(self.all_tokens)
        request = self.request(audio, frames)
        result = await scheduler.decode(self.loaded, request)
        # the earlier windows' text in its prompt (a client's own prompt may well be said in the audio)
        earlier = self.all_tokens[max(self.prompt_reset_since, self.text_from):]
        if request.prompt and earlier and copied_words(self._plain(result.decoded.sampled),
                                                       self._plain(earlier[-len(request.prompt):])) >= COPIED_PROMPT_WORDS:
            # It wrote its conditioning text again, not what it heard (over speech with its pauses cut out, a
            # window read the previous sentences back for 37 s): decoded again without it, as a fallback resets it.
            self.prompt_reset_since = len(self.all_tokens)
            result = await scheduler.decode(self.loaded, self.request(audio, frames))
        self.adopt(result)
        self.windows += 1
        started_inside, self.inside_text = self.inside_text, False
        if self.silent(result):
            self.seek += frames
            return []
        previous_seek = self.seek
        time_offset = self.seek * HOP_LENGTH / SAMPLE_RATE
        current, advance, single_ending = self.split(result.decoded.tokens, result, time_offset, frames,
                                                     logprobs=kept_logprobs(result))
        self.seek += advance
        if self.options.word_timestamps and current:
            await self.align(current, result, frames, tasks)
            if started_inside and frames < N_FRAMES and (cut := hallucinated_tail(current)) < len(current):
                # A word-end seek short of the last timestamp adds a window from inside the last words to silence
                # (the end, a break); it wrote on, "Seven of Clothes." in words of no length: Whisper's score drops it.
                del current[cut:]
                self.seek = previous_seek + frames
            elif not single_ending:
                # Whisper seeks to the last word's end; never past the window's last timestamp, the decoder's own
                # end of its text: an aligned end 0.22 s past it skipped the next word ("rather", the probe's file
                # with VAD), which the next window would have written.
                last_word_end = segment_end(current)
                if last_word_end is not None and last_word_end > time_offset:
                    self.seek = min(previous_seek + advance, round(last_word_end * FRAMES_PER_SECOND))
                    self.inside_text = self.seek < previous_seek + advance
        if self.seek <= previous_seek:  # never loop on the same window
            self.seek = previous_seek + frames
        if self.options.word_timestamps and current:
            # The next window starts at the seek: a last word aligned past the last timestamp the seek stopped at
            # ended 0.2 s into the next window's first word, its segment too (times went backwards at the seam).
            within(current, time_offset, self.seek * HOP_LENGTH / SAMPLE_RATE)
            last_word_end = segment_end(current)
            if last_word_end is not None:
                self.last_speech_timestamp = last_word_end
        return self.commit(current, result)

    async def align(self, current: list[dict[str, Any]], result: WindowResult, frames: int,
                    tasks: "ExecutionTasks") -> None:
        """mlx-whisper's word timestamps for `current`, as one task on the loop. Raises what MLX raises."""
        from mlx_whisper.timing import add_word_timestamps

        model = CachedAudio(self.loaded.model, result.features)
        await tasks.run(functools.partial(add_word_timestamps, segments=current, model=model, tokenizer=self.tokenizer,
                                          mel=result.features, num_frames=frames,
                                          last_speech_timestamp=self.last_speech_timestamp), label="whisper.align")

    def split(self, tokens: list[int] | np.ndarray, result: WindowResult, time_offset: float, frames: int, *,
              whole: bool = False,
              logprobs: Sequence[float | None] | None = None) -> tuple[list[dict[str, Any]], int, bool]:
        """Segments between timestamp pairs, the frames consumed, and whether the window ended on a single
        timestamp. An unfinished last segment is left for the next window, or kept to the window's end when
        `whole`. Times are clamped to the window's audio. `logprobs` (one for each of `tokens`: kept_logprobs):
        each segment keeps its tokens'. Raises nothing."""
        tokens = np.asarray(tokens, dtype=np.int64)
        tok = self.tokenizer
        precision = self.input_stride * HOP_LENGTH / SAMPLE_RATE
        window_end = time_offset + frames * HOP_LENGTH / SAMPLE_RATE

        def segment(start: float, end: float, a: int, b: int) -> dict[str, Any]:
            end = min(max(end, time_offset), window_end)
            return self._new_segment(min(max(start, time_offset), end), end, tokens[a:b], result,
                                     None if logprobs is None else list(logprobs[a:b]))

        current: list[dict[str, Any]] = []
        is_ts = tokens >= tok.timestamp_begin
        single_ending = is_ts[-2:].tolist() == [False, True]
        consecutive = np.where(np.logical_and(is_ts[:-1], is_ts[1:]))[0] + 1
        if len(consecutive) > 0:
            slices = consecutive.tolist()
            if single_ending:
                slices.append(len(tokens))
            last_slice = 0
            for current_slice in slices:
                sliced = tokens[last_slice:current_slice]
                current.append(segment(time_offset + (int(sliced[0]) - tok.timestamp_begin) * precision,
                                       time_offset + (int(sliced[-1]) - tok.timestamp_begin) * precision,
                                       last_slice, current_slice))
                last_slice = current_slice
            if single_ending:
                return current, frames, True
            last_ts = (int(tokens[last_slice - 1]) - tok.timestamp_begin)
            if whole and last_slice < len(tokens):
                current.append(segment(time_offset + last_ts * precision, window_end, last_slice, len(tokens)))
                return current, frames, False
            return current, min(frames, last_ts * self.input_stride), False
        duration = frames * HOP_LENGTH / SAMPLE_RATE
        timestamps = tokens[is_ts.nonzero()[0]]
        if len(timestamps) > 0 and int(timestamps[-1]) != tok.timestamp_begin:
            duration = (int(timestamps[-1]) - tok.timestamp_begin) * precision
        current.append(segment(time_offset, time_offset + duration, 0, len(tokens)))
        return current, frames, single_ending

    def _new_segment(self, start: float, end: float, tokens: np.ndarray, result: WindowResult,
                     logprobs: list[float | None] | None = None) -> dict[str, Any]:
        token_list = [int(t) for t in np.asarray(tokens).tolist()]
        d = result.decoded
        text_tokens = [t for t in token_list if t < self.tokenizer.eot]
        return {"seek": self.seek, "start": start, "end": end, "text": self.tokenizer.decode(text_tokens),
                "tokens": token_list, "temperature": d.temperature, "avg_logprob": d.avg_logprob,
                "compression_ratio": d.compression_ratio, "no_speech_prob": d.no_speech_prob, "logprobs": logprobs}

    def commit(self, current: list[dict[str, Any]], result: WindowResult | None = None) -> list[Segment]:
        """Add segments to the transcript and to the conditioning text. Raises nothing."""
        for s in current:  # instantaneous or empty segments carry no text
            if s["start"] == s["end"] or not s["text"].strip():
                s["text"], s["tokens"], s["words"] = "", [], []
                s["logprobs"] = None if s.get("logprobs") is None else []
        first_id = len([s for s in self.segments if s["text"]])
        self.segments.extend(current)
        self.all_tokens.extend(t for s in current for t in s["tokens"])
        if result is not None and (not self.options.condition_on_previous_text or result.decoded.temperature > 0.5):
            self.prompt_reset_since = len(self.all_tokens)  # do not condition on text sampled hot
        kept = [s for s in current if s["text"]]
        return [self._to_segment(i, s) for i, s in enumerate(kept, start=first_id)]

    # ---- results ---------------------------------------------------------------------------
    def _span(self, start: float, end: float) -> tuple[float, float]:
        """A segment's source times: kept out of a speech piece it reaches less than half a second into."""
        if self.timeline is None:
            return round(start, 3), round(end, 3)
        a, b = self.timeline.span(start * SAMPLE_RATE, end * SAMPLE_RATE, SPAN_GRACE_S * SAMPLE_RATE)
        return round(a / SAMPLE_RATE, 3), round(b / SAMPLE_RATE, 3)

    def _word_span(self, w: dict[str, Any], start: float, end: float) -> tuple[float, float]:
        """A word's source times, mapped as its segment's and kept inside its `start`, `end`: a window's first word
        starts in the pad before a removed pause, and mapped alone it began up to 1.4 s before its segment."""
        a, b = self._span(float(w["start"]), float(w["end"]))
        # without a timeline the times are Whisper's own, its word and segment adjustments included
        return nest(a, b, start, end) if self.timeline is not None else (a, b)

    def _to_segment(self, i: int, s: dict[str, Any]) -> Segment:
        start, end = self._span(float(s["start"]), float(s["end"]))
        kept = s.get("logprobs")
        return Segment(
            id=i, seek=int(s["seek"]), start=start, end=end,
            text=s["text"], tokens=list(s["tokens"]), temperature=float(s["temperature"]),
            avg_logprob=float(s["avg_logprob"]), compression_ratio=float(s["compression_ratio"]),
            no_speech_prob=float(s["no_speech_prob"]),
            words=[Word(w["word"], *self._word_span(w, start, end), float(w.get("probability", 0.0)))
                   for w in s.get("words", [])],
            logprobs=None if kept is None else tuple(token_logprobs(self.tokenizer, s["tokens"], kept)))

    def _plain(self, tokens: Any) -> str:
        return self.tokenizer.decode([int(t) for t in tokens if t < self.tokenizer.eot])

    def text(self) -> str:
        """All committed text so far. Raises nothing."""
        tokens = [t for t in self.all_tokens[self.text_from:] if t < self.tokenizer.eot]
        return self.tokenizer.decode(tokens)

    def token_counts(self, samples: int) -> TokenCounts:
        """What decoding `samples` of 16 kHz audio (those given to the windows) cost in tokens: the client's prompt's
        tokens a window read (the last n_text_ctx/2 - 1 at most, as mlx-whisper keeps them), one encoder position
        per input_stride mel frames of that audio (50 a second), and the text tokens committed. Raises nothing."""
        room = max(0, self.loaded.model.dims.n_text_ctx // 2 - 1)
        positions = -(-samples // (HOP_LENGTH * self.input_stride))
        written = sum(1 for t in self.all_tokens[self.text_from:] if t < self.tokenizer.eot)
        return TokenCounts(prompt=min(len(self.initial_prompt_tokens), room), audio=positions, output=written)

    def transcript(self, duration: float) -> Transcript:
        """The Transcript of everything decoded so far. Raises nothing."""
        kept = [s for s in self.segments if s["text"]]
        segments = [self._to_segment(i, s) for i, s in enumerate(kept)]
        for s in segments:  # never past the audio
            s.end = min(s.end, round(duration, 3))
            s.start = min(s.start, s.end)
        # its text is its segments' one after another, and so are its log probabilities, where all kept them
        known = self.options.logprobs and all(s.logprobs is not None for s in segments)
        return Transcript(text=self.text(), language=self.language or self.options.named_language,
                          duration=duration, task=self.options.task, segments=segments,
                          logprobs=tuple(e for s in segments for e in s.logprobs or ()) if known else None)
