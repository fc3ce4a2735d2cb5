"""The pump of a live session (audio/sessions.py LiveSession builds on it): received audio through the VAD gate
into the transcription, the decodes it asks for, and commits, clears and marks at their points in the audio.

The gate keeps going while a decode runs, so the end of an utterance is seen when its audio comes, not when the
decode ends. Options changed mid-session take effect at their point in the audio too (_retune). Capture (appending
audio, caps, the requests themselves) is LiveSession's.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Awaitable, Callable, Literal

import anyio

from audio.buffers import AudioBuffer, AudioPool
from audio.exception_frames import FramesReleased, release_frames
from audio.live import LiveConfig, LiveTranscription, SessionEvent
from audio.pcm import SAMPLE_RATE
from audio.transcript import TranscribeOptions, Transcript
from audio.vad import Speech, SpeechGate

if TYPE_CHECKING:
    from audio.container_chunks import ContainerChunks
    from audio.whisper import WhisperResidency

__all__ = ["Control", "SessionPump", "speech_gate"]

# What a session was asked to do at a raw sample: (what, the sample, a commit's ref), in the order asked.
Control = tuple[Literal["commit", "clear", "mark", "options", "end"], int, str | None]


def speech_gate(options: TranscribeOptions) -> SpeechGate | None:
    """The session's VAD gate for `options` (None with vad off). Raises nothing."""
    return SpeechGate(**options.gate_settings) if options.vad else None


class SessionPump:
    """Gating and decoding for one live session; the state below is set up by LiveSession.__init__."""

    options: TranscribeOptions
    config: LiveConfig
    live: LiveTranscription
    scope: anyio.CancelScope
    events_log: list[SessionEvent]
    windows_done: int
    last_active: float
    error: BaseException | None
    _clock: Callable[[], float]
    _residency: "WhisperResidency"
    _pool: AudioPool
    _raw: AudioBuffer  # received, not yet through the gate
    _gate: SpeechGate | None
    _origin: int  # raw sample where the gate started (a clear() restarts it)
    _gated: int  # raw samples through the gate
    _boundary: int  # raw sample of the last commit, clear or VAD pause
    _controls: deque[Control]
    _containers: ContainerChunks
    _asked: deque[TranscribeOptions]  # for each "options" control, in order: what reconfigure() was given
    _finishing: bool
    _idle: bool
    _pumping: bool
    _wake: anyio.Event
    _changed: anyio.Event
    _done: anyio.Event
    _result: Transcript | None

    @property
    def received_seconds(self) -> float:
        return self._raw.total / SAMPLE_RATE

    def _settled(self) -> int:
        gated = self._origin + self._gate.settled if self._gate is not None else self._gated
        return min(gated, self._gated, self._raw.total)

    def _emit(self, event: SessionEvent) -> None:
        self.events_log.append(event)
        self._signal()

    def _signal(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    # ---- the pump -----------------------------------------------------------------------------
    async def pump(self) -> None:
        """Gate audio, decode, commit; until finished or cancelled. Never raises: a failure is kept for finish."""
        self._pumping = True
        try:
            with self.scope:
                await self._decode_all()
        except Exception as exc:  # a failed window ends the session; finish reports it
            release_frames(exc)  # kept with the session: the frames it passed (and their model) are not
            self.error = exc
        finally:
            self.live.unbind()
            self._pool.forget(self)
            self._containers.abort()  # however the session ended, no container decoder thread outlives it
            for what, _, ref in self._controls:  # marks still waiting are owed to their callers all the same
                if what == "mark" and ref is not None:
                    self._emit(SessionEvent("mark", ref=ref))
            self._controls.clear()
            self._done.set()
            self._signal()

    async def _decode_all(self) -> None:
        """The pump's work, the model taken for it from the first decode on. Raises what a decode raises."""
        taken = False
        try:
            while True:
                await self._gate_pending()
                action = self.live.next_action(self._finishing)
                if action is None:
                    if self._finishing:
                        break
                    self._idle = True
                    self._signal()
                    await self._wake.wait()
                    self._wake = anyio.Event()
                    self._idle = False
                    continue
                if not self.live.started:
                    loaded = await self._residency.take()
                    taken = True
                    await self.live.start(loaded)
                await self._run_gating(action)
                self._pool.update(self)
                self.windows_done += 1
                self.last_active = self._clock()  # its client reads what a decode sends: not idle
                self._signal()
            self._result = self.live.transcript(self.received_seconds)
        finally:
            if taken:
                self._residency.release()

    async def _run_gating(self, action: Callable[[], Awaitable[None]]) -> None:
        """Run the decode `action` while the gate goes on taking the audio that arrives, so the end of an
        utterance is seen when its audio comes, not when the decode ends; a pause that closes the utterance a
        probe is decoding cancels that probe (the final decode runs next). Raises what `action` raises."""
        failure: list[BaseException] = []
        finished = False

        async def run() -> None:
            nonlocal finished
            try:
                with FramesReleased():  # cancelled, anyio's task group keeps the frames it passed (exception_frames)
                    await action()
            except Exception as exc:  # kept, so the pump sees the window's own error, not an ExceptionGroup
                failure.append(exc)
            finally:
                finished = True
                self._wake.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            try:
                while True:
                    await self._wake.wait()
                    self._wake = anyio.Event()
                    if finished:
                        break
                    await self._gate_pending(decoding=True)
                    self.live.drop_closed_probe()
            except Exception as exc:  # the session ends with it; the decode is of no use any more
                failure.append(exc)
                tg.cancel_scope.cancel()
        if failure:
            raise failure[0]

    async def _gate_pending(self, decoding: bool = False) -> None:
        """Audio through the gate into the transcription, commits and clears at their points in it. While a
        decode runs (`decoding`) a clear waits for it to end (it drops audio the decode may be reading), and
        so does the audio after it."""
        while self._controls:
            what, at, ref = self._controls[0]  # left queued while it runs: a mark() meanwhile comes after it
            if decoding and what == "clear":
                return
            if what == "commit":
                if not await self._gate_to(at, flush=True, ref=ref, commit=True):  # a flushed VAD pause is the commit
                    self._pause(at, ref, hard=True)
            elif what == "clear":
                self._clear_at(at)
            elif what == "options":
                await self._gate_to(at, flush=False)
                self._retune(self._asked.popleft())
            elif what == "end":  # the session's audio cap: the open utterance ends there, as at a finish
                await self._end_open(at)
            elif ref is not None:
                self._emit(SessionEvent("mark", ref=ref))
            self._controls.popleft()
        if self._finishing:
            await self._end_open(self._raw.total)
        else:
            await self._gate_to(self._raw.total, flush=False)
        self._raw.discard_before(self._settled())
        self._pool.update(self)

    async def _end_open(self, at: int) -> None:
        """No more audio comes for the open utterance (a finish, an expiry, the audio cap): the audio up to `at`
        through the gate, an open speech region closed there (speech_stopped), and the utterance paused."""
        await self._gate_to(at, flush=True)
        if self.live.has_open:
            self._pause(at)

    async def _gate_to(self, end: int, flush: bool, ref: str | None = None, commit: bool = False) -> bool:
        """Gate raw audio up to `end`; with `flush` close an open speech region there (its pause carries
        `ref`; a client's `commit` ends it, with no speech_stopped, as OpenAI's server VAD does). Returns whether
        the last thing gated was a pause."""
        pending = self._raw.view(self._gated, end - self._gated)
        start = self._gated
        self._gated += len(pending)
        if self._gate is None:
            if len(pending):
                self.live.add_speech(pending, start)
            return False
        gate, origin = self._gate, self._origin
        if len(pending) > self.config.gate_in_thread_s * SAMPLE_RATE:
            events = await anyio.to_thread.run_sync(gate.push, pending)
        else:
            events = gate.push(pending)
        flushed = gate.flush() if flush else []
        for ev in events + flushed:
            if isinstance(ev, Speech):
                a, b = ev.start + origin, ev.end + origin
                if ev.first:
                    self._emit(SessionEvent("speech_started", audio_ms=a * 1000 // SAMPLE_RATE,
                                               item=self.live.utterances.opened))
                self.live.add_speech(self._raw.view(a, b - a), a)
            else:
                at = ev.at + origin
                self._boundary = max(self._boundary, at)
                if not (commit and ev in flushed):
                    self._emit(SessionEvent("speech_stopped", audio_ms=at * 1000 // SAMPLE_RATE,
                                           item=self.live.utterances.opened))
                self._pause(at, ref if ev in flushed else None, hard=commit and ev in flushed)
        return bool(flushed) and not isinstance(flushed[-1], Speech)

    def _retune(self, options: TranscribeOptions) -> None:
        """`options` from the audio gated so far on: the gate's settings for the speech regions that begin after it,
        the decoding's for the utterances that begin after it (LiveTranscription.retune). VAD turned off passes on
        what the gate still held back, as the open utterance's audio; turned on, a gate starts here."""
        self.options = options
        if not options.vad:
            if self._gate is not None:
                self._gated, self._gate = self._settled(), None
        elif self._gate is None:
            self._origin, self._gate = self._gated, speech_gate(options)
        else:
            self._gate.retune(**options.gate_settings)
        self.live.retune(options)

    def _pause(self, at: int, ref: str | None = None, hard: bool = False) -> None:
        item = self.live.add_pause(hard)  # hard: a client's commit, which no decode crosses
        self._emit(SessionEvent("audio_committed", audio_ms=at * 1000 // SAMPLE_RATE, item=item, ref=ref))

    def _clear_at(self, at: int) -> None:
        """Drop raw audio not yet gated up to `at`, restart the gate there, and clear the open utterance."""
        self._gated = max(self._gated, at)
        self._origin = at
        self._gate = speech_gate(self.options)
        if self.live.utterances.open_text:  # its committed text stays: the utterance closes with it
            self._emit(SessionEvent("audio_committed", audio_ms=at * 1000 // SAMPLE_RATE,
                                   item=self.live.utterances.opened))
        self.live.clear()
        self._emit(SessionEvent("cleared", audio_ms=at * 1000 // SAMPLE_RATE, item=self.live.utterances.opened))
