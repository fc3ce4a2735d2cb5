"""LiveTranscription — the decoding side of a live session: speech-only audio, re-decoded as it grows, text
committed once it is stable.

After about `redecode_s` of new speech the open audio (after the seek) is decoded again with the committed
text forced as a prefix (audio/agreement.py): what two consecutive decodes agree on is committed, the rest is
tentative. A pause (VAD or commit()) commits everything before it, and cancels a probe then in flight (the
final decode gives that text); 30 s of open speech is decoded as one seek-loop window; a session that fell
behind finishes all its pending utterances that fit a window with one decode, its text split among them by
where its words were said (aligned as a file's word timestamps are). A client's commit is a hard pause: no decode
crosses it, and the next starts there (a file's window ends at a long silence so). Committed text never changes.
Finished segments are trimmed off the open audio once it is longer than `trim_s`; until then earlier speech
stays as context for the next decode, unless an utterance's first guess over it comes back empty: then it is
finished and the guess tried again at once over the utterance alone. A guess that loops ends the conditioning on
earlier text, as a fallback does in the seek loop. A sampled timestamp past the decoded audio is clamped to its
end before it is forced again (audio/text_end.py), and a sentence a decode writes twice is committed once
(audio/repeats.py).
The guesses themselves, and why an utterance's first commit waits for a few seconds of it: audio/guesses.py; how much
new speech comes before the next guess: audio/guess_cadence.py; what a looping first guess still shows:
audio/loop_head.py. Utterances are numbered and closed as audio/utterances.py says; a client's clear() and a
session's new options: audio/live_requests.py.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import TYPE_CHECKING, Awaitable, Callable, Sequence

import anyio
import numpy as np

from audio.agreement import LiveText
from audio.buffers import AudioBuffer
from audio.guess_cadence import GuessCadence
from audio.guesses import LiveGuesses
from audio.decoding import HOP_LENGTH, N_FRAMES, N_SAMPLES, WindowedTranscription
from audio.live_config import LiveConfig, SessionEvent
from audio.live_requests import LiveRequests
from audio.pcm import SAMPLE_RATE
from audio.loop_head import loop_head
from audio.repeats import committed_segments, without_repeats
from audio.text_end import clamped_timestamps, closed_at, stopped_short
from audio.token_logprobs import aligned_logprobs, committed_logprobs
from audio.window import WindowResult
from audio.timeline import Timeline
from audio.transcript import TranscribeOptions, Transcript
from audio.utterances import Utterances
from audio.word_alignment import align_words, token_times

if TYPE_CHECKING:
    from audio.scheduler import WhisperScheduler
    from audio.whisper import LoadedWhisper

__all__ = ["LiveConfig", "SessionEvent", "LiveTranscription"]


class LiveTranscription(LiveGuesses, LiveRequests):
    """Open speech audio and its text. Feed it with add_speech/add_pause; run what next_action returns until
    it returns None. Not thread-safe; event loop only."""

    def __init__(self, options: TranscribeOptions, config: LiveConfig, scheduler: "WhisperScheduler",
                 emit: Callable[[SessionEvent], None], scope: "anyio.CancelScope | None" = None,
                 clock: Callable[[], float] = anyio.current_time) -> None:
        self.options, self.config, self._scope, self._clock = options, config, scope, clock
        self._asked = options  # the options asked for last (retune)
        self._cadence = GuessCadence(config)  # how much new speech before the next guess
        self.timeline = Timeline()
        self._scheduler, self._emit = scheduler, emit
        self._open = AudioBuffer()  # speech (compact samples); trimmed at the seek
        self.utterances = Utterances(emit, lambda: self.language)
        self._tr: WindowedTranscription | None = None
        self._live: LiveText | None = None
        self._loaded: "LoadedWhisper | None" = None
        self._probed_at = 0  # compact length at the last re-decode
        self._decoded_to = 0  # compact samples covered by the latest decode
        self._final_to = 0  # compact samples whose text is all committed
        self._last_result: WindowResult | None = None
        self._probe_scope: anyio.CancelScope | None = None  # the probe in flight
        self._committed: list[str] = []
        self._loop_head: list[int] | None = None  # what the last guess showed before it looped (see _probe)
        self.tentative = ""
        # Decodes keep each sampled token's log probability, and committed text carries its tokens' (a session's
        # `include` asks for them; LiveSession.reconfigure sets it for the decodes that run after it).
        self.logprobs = options.logprobs
        self.agreement = options.agreement  # decodes that must agree before text is committed (LiveSession.reconfigure)
        # A chunk was refused for the session's backlog since the last decode began (LiveSession._admit): a guess over
        # all the open audio is due at once, or the audio that would make one due never comes (see next_action).
        self.pressed = False

    @property
    def started(self) -> bool:
        return self._tr is not None

    @property
    def language(self) -> str:
        """Whisper's code for the language the text is decoded in: given, English for an English-only model, else
        detected by a decode (before one: the one a transcript names). Raises nothing."""
        return (self._tr.language if self._tr is not None else None) or self.options.named_language

    @property
    def held_samples(self) -> int:
        return self._open.held

    @property
    def pending_samples(self) -> int:
        """Speech not yet covered by any decode. Raises nothing."""
        return max(0, self.timeline.length - self._decoded_to)

    async def start(self, loaded: "LoadedWhisper") -> None:
        """Bind the model (tokenizes the prompt in a worker thread). Raises nothing of its own."""
        self._loaded = loaded
        # A looping guess's reset ends the conditioning on earlier text (_probe), never the client's prompt and
        # vocabulary (reset with it, the first guess's reset took them from every decode: "Queen of Cloves").
        self._tr = await WindowedTranscription.start(loaded, self.options, timeline=self.timeline, carry_prompt=True)
        self._live = LiveText(self._tr.tokenizer)

    def unbind(self) -> None:
        """Drop the model once decoding is over: the session's cycles kept it until a (rare) full collection."""
        self.cancel_probe()
        self._tr = self._loaded = self._last_result = None

    def add_speech(self, pcm: np.ndarray, source_start: int) -> None:
        """Speech from `source_start` (samples into the received audio). Raises ValueError going back in time."""
        self.timeline.add(source_start, len(pcm))
        self._open.append(pcm)

    def add_pause(self, hard: bool = False) -> int:
        """The open utterance ended here (even an empty one: every pause closes one utterance; `hard`: a client's
        commit). Returns its index. Raises nothing."""
        return self.utterances.pause(self.timeline.length, hard)

    @property
    def has_open(self) -> bool:
        """The open utterance has audio or committed text. Raises nothing."""
        return self.timeline.length > self.utterances.open_from or self.utterances.open_text

    def committed_text(self) -> str:
        return "".join(self._committed)

    def _seek(self) -> int:
        return self._tr.seek * HOP_LENGTH if self._tr is not None else 0

    def next_action(self, finishing: bool) -> Callable[[], Awaitable[None]] | None:
        """The next decode to run, or None while nothing is due (with `finishing`: when all is committed).
        Pauses whose audio is already all committed close their utterances here."""
        self.utterances.close_through(max(self._seek(), self._final_to))
        while (asked := self.utterances.options_due()) is not None:  # their utterances come next
            self._begin(*asked)
        seek = self._seek()
        length = self.timeline.length
        limit = self.utterances.pauses[0] if self.utterances.pauses else length
        if limit - seek >= N_SAMPLES:
            return self._full_window
        if self.utterances.pauses:
            # Behind: the pauses already here that fit one decode are finished by it — within one window, and
            # within the text the decoder has room for (more would be cut off at its token cap, and lost).
            last = self.utterances.reach(seek + min(N_SAMPLES, self._room_samples()))
            return lambda: self._final(last)
        if finishing:
            return (lambda: self._final(length)) if length - self._final_to >= HOP_LENGTH else None
        every = self._cadence.every(bool(self.utterances.text or self.tentative))
        due = every is not None and length - self._probed_at >= every * SAMPLE_RATE
        # Pressed: behind (a guess every slow_redecode_s) under a backlog limit shorter than that, no guess came due,
        # and the speech that would make one due was refused (a session stuck at 429s until it expired). A guess
        # covers all the speech, so the lag falls, and commits only what agrees: no word is cut at a chunk's end.
        due = due or (self.pressed and self.pending_samples >= HOP_LENGTH)
        if due and length - self._final_to >= HOP_LENGTH:
            # A prefix near the context's limit is settled instead: everything so far is committed.
            return (lambda: self._final(length)) if self._prefix_full() else self._probe
        return None

    def _room_samples(self) -> float:
        """Audio whose text fits what a decode may still sample after the forced prefix (at the rate
        tokens_per_second assumes). Raises nothing."""
        if self._tr is None or self._live is None:
            return float(N_SAMPLES)
        room = self._tr.loaded.model.dims.n_text_ctx // 2 - len(self._live.prefix) - 16
        return max(0, room) / self.config.tokens_per_second * SAMPLE_RATE

    def _prefix_full(self) -> bool:
        return self._live is not None and self._tr is not None and \
            len(self._live.prefix) > self._tr.loaded.model.dims.n_text_ctx // 4

    async def _decode(self, count: int, probe: bool = False, scope: "anyio.CancelScope | None" = None,
                      features: bool = False) -> WindowResult | None:
        """Decode the open audio from the seek, the committed prefix forced (its window leaves the scheduler
        once `scope`, else the session's scope, is cancelled). A probe tries one temperature and gives None
        when its text loops (over the compression threshold, or a short run over a cut context): no guess.
        `features`: the result keeps the encoder output (word alignment)."""
        assert self._tr is not None and self._live is not None and self._loaded is not None
        self._loop_head = None
        self.pressed = False  # the refusals so far are answered by this decode: it covers the speech they waited on
        seek = self._seek()
        audio = self._open.view(seek, count)
        request = self.config.shape(
            self._tr.request(audio, len(audio) // HOP_LENGTH, prefix=self._live.prefix,
                             tokens_per_second=self.config.tokens_per_second, fallback=not probe, realtime=True),
            probe, fresh=seek + len(audio) - max(seek, self._final_to), n_audio_ctx=self._loaded.model.dims.n_audio_ctx,
            chat_active=self._scheduler.chat_active())
        if request.logprobs != self.logprobs:  # its own ask (reconfigure), not its options' until they are retargeted
            request = replace(request, logprobs=self.logprobs)
        if features:
            request = replace(request, keep_features=True)
        began = self._clock()
        result = await self._scheduler.decode(self._loaded, request, scope or self._scope)
        self._cadence.decode_s = self._clock() - began
        self._tr.adopt(result)
        self._decoded_to = max(self._decoded_to, seek + len(audio))
        # A looping guess (over a cut context too) is no guess: two would agree and commit the loop. An improbable one
        # still is: cut mid-speech, a short guess ends uncertain, and only what the next repeats is committed.
        if probe and (request.repetitive(result.decoded)
                      or request.loops_over_cut_context(result.decoded, self._tr.tokenizer.eot)):
            self._loop_head = loop_head(list(result.decoded.sampled), self._tr.tokenizer.eot,
                                        [*request.prompt, *request.prefix], self._text)  # what it may still show
            return None
        self._last_result = result
        return result

    def _text(self, tokens: list[int]) -> str:
        assert self._tr is not None
        eot = self._tr.tokenizer.eot
        return self._tr.tokenizer.decode([t for t in tokens if t < eot])

    def _commit_text(self, tokens: list[int], logprobs: Sequence[float | None] | None = None) -> None:
        """Commit the text of `tokens` (less what repeats the text before it), with the log probabilities of its
        tokens where `logprobs` (one for each of `tokens`: `aligned_logprobs`) has them. Raises nothing."""
        assert self._tr is not None
        before, full = "".join(self.utterances.text), self._text(tokens)
        text = without_repeats(before, full)
        if text:
            entries = committed_logprobs(self._tr.tokenizer, tokens, logprobs, before, full, text)
            self._committed.append(text)
            self.utterances.add(text, entries)
            self._emit(SessionEvent("committed", text=text, item=self.utterances.closed, logprobs=entries))

    def _set_tentative(self, tokens: list[int]) -> None:
        text = self._text(tokens) if self._tr is not None else ""
        if text != self.tentative:
            self.tentative = text
            self._emit(SessionEvent("tentative", text=text, item=self.utterances.closed))

    def _clamped(self, tokens: list[int], seek: int, end: int, forced: int) -> list[int]:
        """`tokens` with no sampled timestamp past `end` (the decoded audio's end) (text_end.clamped_timestamps)."""
        assert self._tr is not None
        return clamped_timestamps(tokens, self._tr.tokenizer.timestamp_begin,
                                  (end - seek) // (self._tr.input_stride * HOP_LENGTH), forced)

    def _trim(self, result: WindowResult, end: int) -> None:
        """Finish the complete segments of the committed prefix once the open audio is longer than trim_s
        (kept until then: earlier speech is context for the next decode). `end`: where `result`'s audio ended
        (speech may have arrived since, while it was decoded)."""
        tr, live = self._tr, self._live
        assert tr is not None and live is not None
        seek = self._seek()
        if self.timeline.length - seek <= self.config.trim_s * SAMPLE_RATE:
            return
        j = live.boundary()
        if not j:
            return
        shift = live.prefix[j - 1] - tr.tokenizer.timestamp_begin
        frames = (end - seek) // HOP_LENGTH
        current, _, _ = tr.split(live.prefix[:j], result, seek / SAMPLE_RATE, frames)
        tr.commit(current, result)
        tr.seek += max(1, min(frames, shift * tr.input_stride))
        live.trim(j, shift)
        self._open.discard_before(self._seek())

    async def _full_window(self) -> None:
        """30 s of open speech: the seek loop's window, with the committed prefix forced."""
        tr, live = self._tr, self._live
        assert tr is not None and live is not None
        seek = self._seek()
        result = await self._decode(N_SAMPLES)
        assert result is not None
        self._probed_at = max(self._probed_at, seek + N_SAMPLES)
        if tr.silent(result) and not live.prefix:
            tr.seek += N_FRAMES
        else:
            tokens = result.decoded.tokens
            current, advance, _ = tr.split(tokens, result, seek / SAMPLE_RATE, N_FRAMES)
            covered = sum(len(s["tokens"]) for s in current)
            rest = live.prefix[covered:]
            if covered > len(live.prefix):
                logprobs = aligned_logprobs(result.decoded.logprobs, len(live.prefix))
                self._commit_text(tokens[len(live.prefix):covered],
                                  logprobs[len(live.prefix):covered] if logprobs is not None else None)
            tr.commit(current, result)
            tr.seek += max(1, advance)
            live.reset()
            live.prefix = rest
            live.trim(0, advance // tr.input_stride)
        self._open.discard_before(self._seek())
        self._set_tentative([])

    async def _final(self, limit: int) -> None:
        """Everything up to `limit` (a pause, commit() or the end) is committed; the pauses up to it close
        their utterances."""
        tr, live = self._tr, self._live
        assert tr is not None and live is not None
        self._cadence.empty = False  # the next utterance's guesses start afresh
        seek = self._seek()
        several = sum(1 for p in self.utterances.pauses if p <= limit) > 1  # behind: split by where words were said
        result = await self._decode(limit - seek, features=several) if limit - seek >= HOP_LENGTH else None
        if result is not None and not (tr.silent(result) and not live.prefix):
            tokens = self._clamped(result.decoded.tokens, seek, limit, len(live.prefix))
            stop = stopped_short(tokens, tr.tokenizer.timestamp_begin, tr.input_stride * HOP_LENGTH, seek, limit,
                                 len(live.prefix)) if result.decoded.sampled else None
            short, keep = stop if stop is not None else (None, len(tokens))
            tokens = tokens[:keep]  # an unclosed last segment is decoded again from its start, not kept
            logprobs, at = aligned_logprobs(result.decoded.logprobs, len(live.prefix)), len(live.prefix)

            def commit(group: list[int]) -> None:  # the groups are tokens[len(live.prefix):] in order, cut up
                nonlocal at
                self._commit_text(group, logprobs[at:at + len(group)] if logprobs is not None else None)
                at += len(group)

            times = await self._token_times(tokens, result, seek, limit) if several else None
            self.utterances.commit_by_pause(tokens, len(live.prefix), tr.tokenizer.timestamp_begin,
                                            tr.input_stride * HOP_LENGTH, seek, limit, commit, times)
            if short is None:  # its text runs to its pause: the next decode goes on from there, not before it
                tokens = closed_at(tokens, tr.tokenizer.timestamp_begin,
                                   (limit - seek) // (tr.input_stride * HOP_LENGTH), len(live.prefix))
            live.reset()
            live.prefix = list(tokens)
            if short is not None:
                # Whisper ended its text well before the speech did (it does near a window's end): what it said
                # stays, and the rest is decoded again from where its text ended.
                self._finish_all(short)
                self._probed_at = max(self._probed_at, short)
                self._set_tentative([])
                self.utterances.close_through(short)
                return
        self._final_to = self._probed_at = max(self._probed_at, limit)
        self._set_tentative([])
        if not live.prefix or self._prefix_full() or self.utterances.hard_at(limit):
            self._finish_all(limit)  # after a commit the next decode starts there: its audio is not context
        elif result is not None:
            self._trim(result, limit)
        self.utterances.close_through(limit)

    async def _token_times(self, tokens: list[int], result: WindowResult, seek: int,
                           limit: int) -> list[float | None] | None:
        """Where (compact samples) each of `tokens`, a decode from `seek` to `limit`, was said: its words aligned
        over the decode's encoder output (None without it). Whisper's segment times over several utterances were
        whole seconds off, a segment holding five. Raises what MLX raises."""
        features, result.features = result.features, None  # kept for this alone
        assert self._tr is not None and self._loaded is not None
        eot = self._tr.tokenizer.eot
        if features is None:
            return None
        frames = min((limit - seek) // HOP_LENGTH, 2 * int(features.shape[1]))
        words = await self._scheduler.tasks.run(functools.partial(
            align_words, self._loaded.model, self._tr.tokenizer, [t for t in tokens if t < eot], features, frames),
            label="whisper.align")
        return token_times(words, tokens, eot, seek)

    def _finish_all(self, limit: int) -> None:
        """All committed text up to `limit` joins the transcript and the open audio before it goes."""
        tr, live, result = self._tr, self._live, self._last_result
        assert tr is not None and live is not None
        if result is not None and live.prefix:
            seek = self._seek()
            frames = max(1, (limit - seek) // HOP_LENGTH)
            current, _, _ = tr.split(live.prefix, result, seek / SAMPLE_RATE, frames, whole=True)
            tr.commit(current, result)
        live.reset()
        tr.seek = max(tr.seek, limit // HOP_LENGTH)
        self._open.discard_before(self._seek())

    def transcript(self, duration: float) -> Transcript:
        """Everything committed, as a Transcript over `duration` s of received audio. Raises nothing."""
        if self._tr is None:
            return Transcript("", self.options.named_language, duration, self.options.task)
        self._finish_all(self.timeline.length)
        t = self._tr.transcript(duration)
        t.text = self.committed_text()
        t.segments = committed_segments(t.segments, t.text)  # the decoder's prefix kept repeats the text left out
        return t
