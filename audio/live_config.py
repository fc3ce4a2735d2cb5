"""What a live session is configured with (LiveConfig, which also shapes each decode it asks for) and what it tells
its clients (SessionEvent)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from audio.encoder import fitted_context
from audio.pcm import SAMPLE_RATE
from audio.window import WindowRequest
from engine.accelerator import on_gpu

if TYPE_CHECKING:
    from audio.token_logprobs import TokenLogprob

__all__ = ["LiveConfig", "SessionEvent", "EventType"]


@dataclass(frozen=True)
class LiveConfig:
    """`redecode_s`: new speech before the open audio is decoded again. `first_redecode_s`: the same before an
    utterance's first guess, while it has no text yet (None: `redecode_s`; never more than it). `trim_s`: open audio
    kept as context before finished segments are trimmed off. `guess_slow_s`: after a decode that took longer (its
    wait for the scheduler included) guesses run only every `slow_redecode_s` of new speech (None: none) until a
    decode comes back sooner (None: guesses whatever the load). `first_commit_s`: an utterance's audio before its first
    commit (audio/guesses.py; its guesses show as tentative text meanwhile). `tokens_per_second`: sampled tokens
    allowed per second of window (plus 16), so a decode that loops stops early. `max_session_s`: audio one session may
    receive. `max_lag_s`: untranscribed audio a session may hold before new chunks are refused (None: no limit).
    `gate_in_thread_s`: pending audio above which the VAD runs in a worker thread. `context`: "whole", the
    whole 30 s window, as mlx-whisper; "fit", a decode of at least `context_from_s` of audio encodes that audio
    plus 1 s, in steps of 5 s, at least `context_min_s` (a final whose text fails the thresholds or loops is
    redone over the whole window, a guess that loops is no guess; while chat has no rows a guess is fitted at any
    length: `fit_guesses_alone`); "auto", fit where MLX computes on the CPU, whole on a GPU (see `fits`)."""

    redecode_s: float = 1.0
    # The first word comes one decode (~1 s on a 2-core CPU, tiny.en) after this much speech. Measured over
    # the wire with the shared clips (bench/RESULTS.md): 1.0 s → first word p50 1.7–1.8 s; 0.75 s → 1.4–1.5 s;
    # 0.5–0.6 s → 2.0–2.1 s (the VAD's padding is most of it, the guess comes back empty and costs a decode).
    # A wrong early guess is harmless: LocalAgreement commits only what the next guess repeats.
    first_redecode_s: float | None = 0.75
    # After a first guess that came back empty (too little of the word yet, or no guess), the next comes sooner.
    retry_redecode_s: float | None = 0.5
    trim_s: float = 15.0
    # What is committed first is forced at the start of every later decode: tiny.en's decodes of 1.25-4.5 s of a
    # LibriVox sentence left its first word out ("And"), two agreed, and the word was lost (audio/guesses.py).
    first_commit_s: float = 5.0
    # 8 speakers on 2 cores fell 8-11 s behind, each guessing over all its open audio again and again (a guess
    # of one speaker here takes 0.2-0.6 s, a final up to ~1.5 s).
    guess_slow_s: float | None = 2.0
    # While behind, a guess still runs once this much new speech came since the last (None: none until a decode
    # comes back sooner): 4 sessions beside a busy chat on 2 cores showed one 25 s utterance nothing for 37 s.
    slow_redecode_s: float | None = 5.0
    tokens_per_second: float = 10.0
    max_session_s: float = 3600.0
    max_lag_s: float | None = 120.0
    gate_in_thread_s: float = 2.0
    # Whisper encodes a 30 s window whatever the audio's length; live decodes hold a few seconds, so most of the
    # encoder's work (~0.64 s a window on a 2-core CPU with tiny.en) went on padding. 10 s: audio/encoder.py.
    context: Literal["auto", "fit", "whole"] = "auto"
    context_min_s: float = 10.0
    # Over a cut context Whisper is less sure of a second or two of speech: first guesses of 0.75–1.75 s failed
    # the logprob threshold where the whole window passed them (tiny.en, the shared clips); from 2.25 s on, none.
    # (2.5 s made the second clip's first guess, over 2.46 s, a whole-window decode: 0.82 s against 0.25 s here.)
    context_from_s: float = 2.25
    # While chat has no rows, a guess is fitted at any length (where `fits` would fit a longer one): a whole-window
    # guess took 1.0-1.5 s on a slow 2-core host (first words 1.6-2.7 s late against 1.1-1.2 s fitted). Beside chat
    # guesses stay whole: fitted ones there raised chat's p99 beside 4 sessions (bench/RESULTS.md, 27th session).
    fit_guesses_alone: bool = True

    def shape(self, request: WindowRequest, guess: bool, fresh: int, n_audio_ctx: int,
              chat_active: bool = True) -> WindowRequest:
        """`request` (a live decode's) with a guess's sampled tokens capped by its `fresh` samples (those after the
        last final) and a fitted context where `fits` (for a guess while not `chat_active`, at any length). Raises
        nothing."""
        if guess and request.sample_len is not None:
            # A guess writes only the speech after the last final (earlier text is forced): a guess that loops
            # stops after what that speech could hold instead of what the whole open audio could (3 s of a looping
            # "8 8 8" held one clip's guesses on this CPU).
            request = replace(request, sample_len=min(request.sample_len,
                                                      16 + int(self.tokens_per_second * fresh / SAMPLE_RATE)))
        if self.fits(len(request.audio), any_length=guess and self.fit_guesses_alone and not chat_active):
            request = replace(request, audio_ctx=fitted_context(n_audio_ctx, len(request.audio), self.context_min_s),
                              redo_whole=not guess)
        return request

    def fits(self, samples: int, any_length: bool = False) -> bool:
        """Whether a decode of `samples` (16 kHz) encodes a fitted context (from `context_from_s`, or at
        `any_length`). "auto" fits on MLX's CPU backend only:
        there the encoder bounds how many speakers keep up (4 on 2 cores with it, not without); on the H200 they
        keep up with whole windows, and fitted ones raised chat's token gaps beside them (bench/RESULTS.md,
        eleventh session). Raises nothing."""
        if self.context == "whole" or (samples < self.context_from_s * SAMPLE_RATE and not any_length):
            return False
        if self.context == "fit":
            return True
        return not on_gpu()


EventType = Literal["speech_started", "speech_stopped", "audio_committed", "committed", "tentative", "utterance",
                    "cleared", "mark"]


@dataclass(frozen=True)
class SessionEvent:
    """What a client of a live session hears about, for utterance `item`: speech_started / speech_stopped
    (`audio_ms` into the received audio), audio_committed (the utterance's audio ended: a VAD pause, commit()
    or finish), committed (new text that never changes), tentative (the current guess after it, which
    replaces the previous one), utterance (all text of the utterance, once it is transcribed), cleared (the
    open audio without committed text was dropped), mark (LiveSession.mark: a caller's place in the log). `ref`:
    what the caller passed to the commit() that closed the utterance, or to mark(). `logprobs`: on committed and
    utterance, the log probabilities of the text's tokens, where the session keeps them (LiveTranscription.logprobs)
    and they are known for all of it (else None). `language`: on utterance, Whisper's code for the language its text
    was decoded in (given, English for an English-only model, else detected)."""

    type: EventType
    text: str = ""
    audio_ms: int | None = None
    item: int = 0
    ref: str | None = None
    logprobs: "tuple[TokenLogprob, ...] | None" = None
    language: str | None = None
