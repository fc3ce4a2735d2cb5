"""Live sessions: audio appended as it arrives, passed through the VAD gate, transcribed as it grows.

A LiveSession owns capture (PCM decoding, the received audio not yet through the gate), the caps, commit / clear
requests and the event log clients read; its base, the pump (audio/session_pump.py), runs the decodes
(audio/live.py) and keeps gating the audio that arrives while one runs, so a pause is seen when its audio comes.
Audio is never dropped silently: a session that cannot keep up reports its lag; a cap refuses the new chunk with an
error and keeps what was accepted (the audio cap also ends the open utterance there, so its words are transcribed);
only clear() drops audio, on request. commit() and clear() act at the point of the received audio where they were
called, whatever arrives after them.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from typing import TYPE_CHECKING, AsyncIterator, Callable, cast

import anyio
import numpy as np

from audio.buffers import AudioBuffer, AudioLimitExceeded, AudioPool, SessionAudioLimit, SessionBacklogFull
from audio.container_chunks import ContainerChunks, opens_stream
from audio.errors import (AudioInputError, ChunkOverBacklog, CommitEmpty, SessionClosed, SessionError, SessionExpired,
                          SessionLimit, SessionNotFound)
from audio.live import LiveConfig, LiveTranscription, SessionEvent
from audio.noise_reduction import HighPass, NoiseReduction
from audio.pcm import SAMPLE_RATE, PcmFormat, PcmStream
from audio.piped_pcm import PipedPcm
from audio.session_pump import Control, SessionPump, speech_gate
from audio.transcript import TranscribeOptions, Transcript

if TYPE_CHECKING:
    from audio.scheduler import WhisperScheduler
    from audio.whisper import WhisperResidency
    from engine.tasks import ExecutionTasks

__all__ = ["SessionError", "SessionNotFound", "SessionClosed", "SessionLimit", "AudioLimitExceeded",
           "LiveConfig", "SessionEvent", "LiveSession", "AudioBuffer", "AudioPool", "CommitEmpty", "MIN_COMMIT_MS"]

MIN_COMMIT_MS = 100  # OpenAI's least audio a commit needs


# Events a reader has read that stay in the log before they are dropped together (a list's front deletes copy).
_READ_KEPT = 256
# Seconds a container stream closed on the event loop (an expiry, raw audio after it) has to flush its tail.
_LOOP_CLOSE_TIMEOUT = 1.0

class LiveSession(SessionPump):
    """One dictation: `append` PCM, read `events()` or `committed_text()`, `finish` for the Transcript.
    `pump` (hosted by the speech service) does the decoding."""

    def __init__(self, options: TranscribeOptions, residency: "WhisperResidency", scheduler: "WhisperScheduler",
                 tasks: "ExecutionTasks", *, config: LiveConfig | None = None, pool: AudioPool | None = None,
                 session_id: str | None = None, expires: bool = True, owner: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`expires`: the speech service may drop it once idle for its TTL (False: only its owner deletes it).
        `owner`: the id of the API key that opened it (None without keys). `clock`: monotonic seconds, for
        `last_active` (injectable for tests). Raises nothing."""
        self.id = session_id or f"sess_{secrets.token_urlsafe(18)}"  # unguessable: ids are capabilities
        self.options = options
        self.expires = expires
        self.owner = owner
        self.expired: str | None = None  # why the service dropped it for idleness (a message for its client)
        self._clock = clock
        self._scheduler = scheduler
        self.config = config or LiveConfig()
        self.created = self.last_active = clock()
        self.windows_done = 0
        self.scope = anyio.CancelScope()
        self.finished_at: float | None = None
        self.error: BaseException | None = None
        self.events_log: list[SessionEvent] = []
        self._log_base = 0  # the index of events_log[0] among all events: what its reader has read is dropped
        self._residency, self._tasks = residency, tasks
        self._pool = pool or AudioPool(None)
        self._stream: PcmStream | None = None
        self._containers = ContainerChunks()  # container chunks: whole files, or a MediaRecorder's stream in pieces
        self._decoding = anyio.Lock()  # one container chunk decodes at a time, in the order they came
        self.piped = PipedPcm(into=self.append)  # the HTTP route's chunks after a WAV / .au header (sockets: own)
        # told the seconds of each container stream's tail as it is taken (/metrics: append_container's count has
        # a chunk's own audio; a tail comes at a finish, an expiry, with the next stream or raw audio after it)
        self.on_tail: Callable[[float], None] | None = None
        self._raw = AudioBuffer()  # received, not yet through the gate
        self._gate = speech_gate(options)
        self._denoise = _high_pass(options.noise_reduction, None)  # filters what is taken, before the gate
        self._origin = 0  # raw sample where the gate started (a clear() restarts it)
        self._gated = 0  # raw samples through the gate
        self._boundary = 0  # raw sample of the last commit, clear or VAD pause
        # (what, raw sample, the commit's ref), in the order they were asked for
        self._controls: deque[Control] = deque()
        self._capped_at = 0  # raw samples received when the audio cap last refused a chunk
        self._asked: deque[TranscribeOptions] = deque()
        self.live = LiveTranscription(options, self.config, scheduler, self._emit, self.scope)
        self._finishing = False
        self._idle = False
        self._pumping = False  # the pump has started (before that, only audio or a commit waiting is work)
        self._wake = anyio.Event()
        self._changed = anyio.Event()
        self._done = anyio.Event()
        self._result: Transcript | None = None

    # ---- capture (event loop) --------------------------------------------------------------
    @property
    def lag_seconds(self) -> float:
        """Seconds of received audio not yet transcribed (silence counts as done once the gate passed it).
        Raises nothing."""
        return round((self._raw.total - self._settled() + self.live.pending_samples) / SAMPLE_RATE, 3)

    @property
    def closed(self) -> bool:
        return self._finishing or self.scope.cancel_called

    @property
    def busy(self) -> bool:
        """Whether the pump has work in hand: audio not yet gated or decoded, a commit or clear waiting, a decode
        running (its client is reading what comes). A busy session is never idle. Raises nothing."""
        return not self._done.is_set() and (self._wake.is_set() or (self._pumping and not self._idle))

    def touch(self) -> None:
        """The client is still there (a message that carried no audio): the idle clock starts again. Raises
        nothing."""
        self.last_active = self._clock()

    def expire(self, why: str) -> None:
        """Drop the session for idleness: `why` is kept for its client (`expired`). Audio it still holds (an utterance
        whose client went quiet mid-word: VAD never heard it end) is transcribed first, as a finish would, so the
        item whose deltas went out gets its text; otherwise as cancel(). Raises nothing."""
        self.expired = why  # no more audio is taken from here on
        if self.held_samples and not self._finishing and not self.scope.cancel_called:
            self._begin_finish()
            return
        self.cancel()

    def _begin_finish(self) -> None:
        """Stop capture: what was taken goes to the pump, which decodes it and ends. Raises nothing."""
        self._close_stream_here()  # finish() closed it off the loop already
        self._finishing = True
        self.finished_at = self._clock()
        if self._stream is not None:
            self._raw.append(self._filtered(self._stream.flush()))
        self._wake.set()

    @property
    def held_samples(self) -> int:
        """Samples this session holds in memory (not yet transcribed). Raises nothing."""
        return self._raw.held + self.live.held_samples

    def _check_open(self) -> None:
        if self.expired is not None:
            raise SessionExpired(self.expired)
        if self.closed:
            raise SessionClosed(f"session {self.id} is {'finished' if self._finishing else 'closed'}; "
                                "no more audio accepted")

    def _admit(self, samples: int) -> None:
        cap = int(self.config.max_session_s * SAMPLE_RATE)
        if self._raw.total + samples > cap:
            self._end_at_cap()
            raise SessionAudioLimit(f"session {self.id} would pass its audio limit of {self.config.max_session_s:g} s "
                                    f"({self.received_seconds:.1f} s received)")
        lag = self.config.max_lag_s
        if lag is not None and samples / SAMPLE_RATE > lag:  # a 429 here was retried for ever
            raise ChunkOverBacklog(f"a chunk of {samples / SAMPLE_RATE:.1f} s is longer than a session may hold "
                                   f"untranscribed ({lag:g} s): send the audio in smaller chunks, no faster than "
                                   "real time")
        if lag is not None and self.lag_seconds + samples / SAMPLE_RATE > lag:
            self.live.pressed = True  # a decode of what it holds is due now: waiting for more speech, it never came
            self._wake.set()
            raise SessionBacklogFull(f"session {self.id} holds {self.lag_seconds:.1f} s not yet transcribed, with this "
                                     f"chunk's {samples / SAMPLE_RATE:.1f} s past its limit of {lag:g} s: send audio no "
                                     "faster than real time, or retry shortly")
        self._pool.admit(self, samples)

    def _end_at_cap(self) -> None:
        """The audio cap refused a chunk: the open utterance ends where the audio did and is transcribed, as at a
        finish or an expiry (its speaker's later words can no longer come; it had waited, its words lost, for the
        client to leave). Audio that still fits opens the next one. Raises nothing."""
        if self._raw.total > self._capped_at and not self.closed:
            self._flush_stream()  # the resampler's held-back tail is audio sent before the cap
            self._capped_at = self._boundary = self._raw.total
            self._controls.append(("end", self._raw.total, None))
            self._wake.set()

    def append(self, body: bytes, fmt: PcmFormat) -> None:
        """Add one raw chunk. Audio accepted before a refused chunk is kept. Raises AudioInputError (bad chunk),
        AudioLimitExceeded (a cap; an AudioInputError), SessionClosed (after finish, delete or expiry)."""
        self._check_open()
        self._admit(len(body) // (fmt.sample_bytes * max(1, fmt.channels)) * SAMPLE_RATE // max(1, fmt.rate))
        self._close_stream_here()  # raw samples after a container stream: its tail comes first
        if self._stream is None or self._stream.format != fmt:
            if self._stream is not None:
                self._take(self._stream.flush())
            self._stream = PcmStream(fmt)
        self._take(self._stream.push(body))

    def append_samples(self, pcm16k: np.ndarray) -> None:
        """Add already-decoded 16 kHz mono float32 audio. Raises AudioLimitExceeded, SessionClosed."""
        self._check_open()
        self._admit(len(pcm16k))
        self._flush_stream()  # raw chunks' held-back tail was sent before this audio: it goes first
        self._take(np.asarray(pcm16k, np.float32))

    async def append_container(self, body: bytes, *, max_seconds: float | None = None) -> int:
        """Add one chunk of container audio: a whole file, or a piece of a WebM / Ogg / fragmented-MP4 stream (the
        rule: audio/container_chunks.py), decoded in a worker thread. `max_seconds`: a chunk decoding to more is
        refused. Returns the 16 kHz samples taken. Audio accepted before a refused chunk is kept; a refused chunk sent
        again is not decoded twice. Raises AudioInputError (a bad chunk), AudioLimitExceeded (a cap), SessionClosed
        (after finish, delete or expiry)."""
        self._check_open()
        async with self._decoding:
            self._check_open()
            pcm = self._containers.held(body)  # a retry: its stream consumed its bytes already
            if pcm is None:
                pcm = await self._decoded(body, max_seconds)
            try:
                self.append_samples(pcm)
            except AudioLimitExceeded as exc:
                raise self._containers.refused(body, pcm, exc) from None
        return len(pcm)

    async def _decoded(self, body: bytes, max_seconds: float | None) -> np.ndarray:
        """`body`'s audio, decoded off the loop no further than the session can take (a few KB of compressed silence
        decoded to an hour, 630 MB, for a session that holds 120 s). Raises as append_container."""
        if self._containers.open and opens_stream(body):  # the stream before ends where this one begins
            self._take_tail(await anyio.to_thread.run_sync(self._containers.tail_before, body))
        lag, rest = self.config.max_lag_s, self.config.max_session_s - self.received_seconds
        room = rest if lag is None else min(lag, rest)
        cap = room if max_seconds is None else min(room, max_seconds)
        try:
            return await anyio.to_thread.run_sync(self._containers.decode, body, max(0.0, cap))
        except SessionClosed:
            self._check_open()  # expired or finished: say so
            raise
        except AudioInputError as exc:
            if exc.code != "audio_too_long" or cap != room:
                raise
            if lag is not None and lag < rest:  # a 429 here was retried for ever
                raise ChunkOverBacklog(f"the chunk decodes to more than {lag:g} s, longer than a session may hold "
                                       "untranscribed: send the audio in smaller chunks") from None
            self._end_at_cap()
            raise SessionAudioLimit(f"session {self.id} would pass its audio limit of {self.config.max_session_s:g} s "
                                    f"({self.received_seconds:.1f} s received, the chunk decodes to more than the "
                                    f"{max(0.0, rest):.1f} s left)") from None

    def _close_stream_here(self) -> None:
        """Close the open container stream on the event loop and take its tail (a starved decoder flushes in a few
        ms), a short chunk it held dropped; none while a chunk is decoded (finish() closes after it). Raises nothing."""
        if not self._decoding.locked():
            self._take_tail(self._containers.close(_LOOP_CLOSE_TIMEOUT))

    def _take_tail(self, tail: np.ndarray) -> None:
        """The samples a container stream held back until it closed: audio of chunks taken before, so no cap refuses
        them (dropped only once the session is cancelled). Raises nothing."""
        if tail.size and not self.scope.cancel_called:
            self._flush_stream()
            self._take(tail)
            if self.on_tail is not None:
                self.on_tail(tail.size / SAMPLE_RATE)

    def _flush_stream(self) -> None:
        if self._stream is not None:
            self._take(self._stream.flush())
            self._stream = None

    def _filtered(self, pcm: np.ndarray) -> np.ndarray:
        return self._denoise(pcm) if self._denoise is not None else pcm

    def _take(self, pcm: np.ndarray) -> None:
        self._raw.append(self._filtered(pcm))
        self._pool.update(self)
        self.last_active = self._clock()
        self._wake.set()

    def reconfigure(self, options: TranscribeOptions) -> None:
        """New options: at once for a session that has received no audio yet; else from the point of the audio
        received so far on, as commit() acts (SessionPump._retune: the VAD's for the speech regions, the language
        and prompt for the utterances that begin after it; the noise reduction for the audio appended after it, and
        token log probabilities and the decodes that must agree for the decodes that run after it). Raises
        SessionClosed."""
        self._check_open()
        if self._raw.total or self.live.started:
            self._flush_stream()  # the resampler's held-back tail is audio sent before the update
            self._denoise = _high_pass(options.noise_reduction, self._denoise)  # filters the audio taken from here
            self.live.logprobs = options.logprobs  # the decodes from here keep them (or not)
            self.live.agreement = options.agreement  # and commit what so many agree on
            self._controls.append(("options", self._raw.total, None))
            self._asked.append(options)
            self._wake.set()
            return
        self.options = options
        self._gate = speech_gate(options)
        self._denoise = _high_pass(options.noise_reduction, self._denoise)
        self.live = LiveTranscription(options, self.config, self._scheduler, self._emit, self.scope)

    def commit(self, ref: str | None = None) -> None:
        """Close the open utterance at the audio received so far, as a VAD pause would (an `audio_committed`
        event carrying `ref` follows; audio appended later opens the next utterance). Raises SessionClosed,
        CommitEmpty (less than MIN_COMMIT_MS since the last commit, clear or VAD pause)."""
        self._check_open()
        self._flush_stream()  # the resampler's held-back tail is audio sent before the commit
        if self._raw.total - self._boundary < MIN_COMMIT_MS * SAMPLE_RATE // 1000:
            raise CommitEmpty(f"the audio buffer holds less than {MIN_COMMIT_MS} ms since the last commit; "
                              "nothing to commit")
        self._boundary = self._raw.total
        self._controls.append(("commit", self._raw.total, ref))
        self._wake.set()

    def clear(self) -> None:
        """Drop the audio received so far that has no committed text: the open utterance's (audio/live.py
        LiveTranscription.clear) and what the gate has not passed yet; a `cleared` event follows. Raises
        SessionClosed."""
        self._check_open()
        self._stream = None  # the resampler's held-back samples belong to the dropped audio
        self._boundary = self._raw.total
        self._controls.append(("clear", self._raw.total, None))
        self._wake.set()

    def mark(self, ref: str) -> None:
        """Put a `mark` event carrying `ref` into the event log after the events of every commit and clear asked
        for before it (at once when none waits): a caller's replies to its requests keep their order with those
        events. Raises nothing."""
        if self._controls and not self._done.is_set():
            self._controls.append(("mark", self._raw.total, ref))
            self._wake.set()
        else:
            self._emit(SessionEvent("mark", ref=ref))

    async def finish(self) -> Transcript:
        """Stop capture and wait for the rest to be decoded. Idempotent. Raises SessionClosed if cancelled,
        or the decode error that stopped the pump."""
        if self.expired is not None or (self.scope.cancel_called and not self._done.is_set()):
            raise self._gone()  # an expired session's last text went to its event log, not to a caller
        if not self._finishing:
            async with self._decoding:  # after the chunk being decoded (its audio counts); the open stream's tail is
                if self._containers.open and not self._finishing:  # decoded off the loop
                    self._take_tail(await anyio.to_thread.run_sync(self._containers.close))
        if not self._finishing:
            self._begin_finish()
        await self._done.wait()
        if self.error is not None:
            raise self.error
        if self._result is None:
            raise self._gone()
        return self._result

    def _gone(self) -> SessionClosed:
        return SessionExpired(self.expired) if self.expired is not None else \
            SessionClosed(f"session {self.id} was deleted or expired")

    def cancel(self) -> None:
        """Drop the session: its windows leave the scheduler before the next step; finish raises SessionClosed."""
        self.scope.cancel()
        self._containers.abort()  # its decoder thread ends; nothing it holds is wanted
        self.live.cancel_probe()  # a probe's window is bound to its own scope
        self._pool.forget(self)

    # ---- reading (event loop) ---------------------------------------------------------------
    def committed_text(self) -> str:
        return self.live.committed_text()

    async def tentative(self) -> str:
        """The current tentative text (after the committed text; may change). Raises nothing."""
        return self.live.tentative

    async def events(self, start: int = 0) -> AsyncIterator[SessionEvent]:
        """Events from index `start` on, as they happen, until the session ends. The session has one reader (its
        socket): what it has read leaves the log, which a long session's replies (a mark each) grew without bound.
        Raises nothing."""
        i = max(start, self._log_base)
        while True:
            while i - self._log_base < len(self.events_log):
                yield self.events_log[i - self._log_base]
                i += 1
                if i - self._log_base >= _READ_KEPT:
                    del self.events_log[: i - self._log_base]
                    self._log_base = i
            if self._done.is_set():
                return
            await self._changed.wait()

    async def ended(self) -> None:
        """Return once the pump stopped: the session finished, failed or was cancelled. Raises nothing."""
        await self._done.wait()

    async def caught_up(self) -> None:
        """Return once everything appended so far is transcribed as far as it can be (the pump waits for
        audio), or the session ended. Raises nothing."""
        while not self._done.is_set() and not (self._idle and not self._wake.is_set()):
            await self._changed.wait()


def _high_pass(kind: str | None, current: HighPass | None) -> HighPass | None:
    """The input filter for noise reduction `kind` (None: none): `current` while it is that kind's, its state carried
    on. Raises ValueError for an unknown kind (TranscribeOptions refused it already)."""
    if kind is None:
        return None
    if current is not None and current.kind == kind:
        return current
    return HighPass(cast(NoiseReduction, kind))
