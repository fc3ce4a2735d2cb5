"""Live sessions: buffered audio, each full 30 s window decoded as a task while capture goes on.

`finish` then costs about one window. Text from finished windows is committed (never changes); a
tentative decode of the open window (websocket live) may change until it is committed.
"""

from __future__ import annotations

import functools
import time
import uuid
from typing import TYPE_CHECKING

import anyio
import numpy as np

from audio.decoding import HOP_LENGTH, N_SAMPLES, WindowedTranscription
from audio.errors import SessionClosed, SessionError, SessionNotFound
from audio.pcm import SAMPLE_RATE, PcmFormat, PcmStream
from audio.transcript import Segment, TranscribeOptions, Transcript
from audio.vad import has_speech

if TYPE_CHECKING:
    from audio.whisper import WhisperResidency
    from engine.tasks import ExecutionTasks

__all__ = ["SessionError", "SessionNotFound", "SessionClosed", "LiveSession", "AudioBuffer"]


class AudioBuffer:
    """Growing 16 kHz signal addressed by absolute sample index; the decoded prefix can be dropped."""

    def __init__(self) -> None:
        self._data = np.zeros(SAMPLE_RATE * 8, np.float32)
        self._len = 0
        self.base = 0  # absolute index of _data[0]

    @property
    def total(self) -> int:
        return self.base + self._len

    def append(self, x: np.ndarray) -> None:
        need = self._len + len(x)
        if need > len(self._data):
            grown = np.zeros(max(need, 2 * len(self._data)), np.float32)
            grown[: self._len] = self._data[: self._len]
            self._data = grown
        self._data[self._len:need] = x
        self._len = need

    def view(self, start: int, count: int) -> np.ndarray:
        """A copy of samples [start, start+count) (absolute), clipped to what exists. Raises nothing."""
        a = max(0, start - self.base)
        return self._data[a: min(self._len, a + count)].copy()

    def discard_before(self, start: int) -> None:
        """Forget samples before absolute index `start`. Raises nothing."""
        cut = min(self._len, max(0, start - self.base))
        if cut:
            self._data[: self._len - cut] = self._data[cut: self._len]
            self._len -= cut
            self.base += cut


class LiveSession:
    """One dictation: append PCM chunks, windows decode in the background (`pump`), `finish` for the text."""

    def __init__(self, options: TranscribeOptions, residency: "WhisperResidency", tasks: "ExecutionTasks",
                 *, session_id: str | None = None) -> None:
        self.id = session_id or f"sess_{uuid.uuid4().hex[:24]}"
        self.options = options
        self.created = self.last_active = time.monotonic()
        self.windows_done = 0
        self.buffer = AudioBuffer()
        self.scope = anyio.CancelScope()
        self.finished_at: float | None = None  # monotonic time finish was asked
        self.error: BaseException | None = None
        self._residency = residency
        self._tasks = tasks
        self._stream: PcmStream | None = None
        self._finishing = False
        self._wake = anyio.Event()
        self._done = anyio.Event()
        self._transcription: WindowedTranscription | None = None
        self._result: Transcript | None = None
        self._committed: list[Segment] = []

    # ---- capture (event loop) --------------------------------------------------------------
    @property
    def received_seconds(self) -> float:
        return self.buffer.total / SAMPLE_RATE

    @property
    def closed(self) -> bool:
        return self._finishing or self.scope.cancel_called

    def append(self, body: bytes, fmt: PcmFormat) -> None:
        """Add one raw chunk. Audio accepted before a bad chunk is kept. Raises AudioInputError (bad chunk),
        SessionClosed (after finish, delete or expiry)."""
        if self.closed:
            raise SessionClosed(f"session {self.id} is {'finished' if self._finishing else 'closed'}; "
                                "no more audio accepted")
        if self._stream is None or self._stream.format != fmt:
            if self._stream is not None:
                self.buffer.append(self._stream.flush())
            self._stream = PcmStream(fmt)
        self.buffer.append(self._stream.push(body))
        self.last_active = time.monotonic()
        self._poke()

    def append_samples(self, pcm16k: np.ndarray) -> None:
        """Add already-decoded 16 kHz mono float32 audio (a container upload). Raises SessionClosed."""
        if self.closed:
            raise SessionClosed(f"session {self.id} is closed; no more audio accepted")
        self.buffer.append(np.asarray(pcm16k, np.float32))
        self.last_active = time.monotonic()
        self._poke()

    def _poke(self) -> None:
        self._wake.set()

    async def finish(self) -> Transcript:
        """Stop capture and wait for the last window(s). Idempotent. Raises SessionClosed if cancelled,
        or the decode error that stopped the pump."""
        if self.scope.cancel_called and not self._done.is_set():
            raise SessionClosed(f"session {self.id} was deleted or expired")
        if not self._finishing:
            self._finishing = True
            self.finished_at = time.monotonic()
            if self._stream is not None:
                self.buffer.append(self._stream.flush())
            self._poke()
        await self._done.wait()
        if self.error is not None:
            raise self.error
        if self._result is None:
            raise SessionClosed(f"session {self.id} was deleted or expired")
        return self._result

    def cancel(self) -> None:
        """Drop the session: queued windows never run; a finish in progress raises SessionClosed."""
        self.scope.cancel()

    # ---- decoding ---------------------------------------------------------------------------
    def committed_text(self) -> str:
        return "".join(s.text for s in self._committed)

    async def pump(self) -> None:
        """Background loop (the speech service runs one per session): decode each full window as a task,
        then the remainder at finish. Returns when finished or cancelled; never raises."""
        taken = False
        try:
            with self.scope:
                tr: WindowedTranscription | None = None
                while True:
                    if tr is None and (self._finishing or self.buffer.total >= N_SAMPLES):
                        if self._finishing and self.buffer.total == 0:
                            break
                        loaded = await self._residency.take()
                        taken = True
                        tr = self._transcription = WindowedTranscription(loaded, self.options)
                    window = tr.next_window(self.buffer.total, self._finishing) if tr else None
                    if window is None:
                        if self._finishing:
                            break
                        await self._wake.wait()
                        self._wake = anyio.Event()
                        continue
                    assert tr is not None  # a window comes only from a transcription
                    await self._run_window(tr, *window)
                duration = self.buffer.total / SAMPLE_RATE
                if tr is None:
                    self._result = Transcript("", self.options.language or "en", duration, self.options.task)
                else:
                    self._result = tr.transcript(duration)
        except Exception as exc:  # a failed window ends the session; finish reports it
            self.error = exc
        finally:
            if taken:
                self._residency.release()
            self._done.set()

    async def _run_window(self, tr: WindowedTranscription, start: int, frames: int) -> None:
        audio = self.buffer.view(start, N_SAMPLES)
        self.buffer.discard_before(start)
        if self.options.vad and not has_speech(audio[: frames * HOP_LENGTH],
                                               min_speech_ms=self.options.vad_min_speech_ms):
            tr.skip(frames)
            return
        handle = self._tasks.enqueue(functools.partial(tr.step, audio, frames), cancellation=self.scope,
                                     label=f"whisper.window:{self.id}")
        new = await handle
        self._committed.extend(new)
        self.windows_done += 1

    async def tentative(self) -> str:
        """Decode the open (partial) window on a throwaway copy of the seek state: text that may still
        change. Empty when there is no model yet or nothing new. Raises TaskRejected when cancelled."""
        tr = self._transcription
        if tr is None or self._finishing:
            if tr is None and self.buffer.total > SAMPLE_RATE // 2 and not self._finishing:
                return await self._tentative_fresh()
            return ""
        window = tr.next_window(self.buffer.total, True)
        if window is None:
            return ""
        probe = tr.fork()
        start, frames = window
        audio = self.buffer.view(start, N_SAMPLES)
        new = await self._tasks.enqueue(functools.partial(probe.step, audio, frames), cancellation=self.scope,
                                        label=f"whisper.tentative:{self.id}")
        return "".join(s.text for s in new)

    async def _tentative_fresh(self) -> str:
        # Before the first full window no model is held yet: take it for one probe.
        loaded = await self._residency.take()
        try:
            probe = WindowedTranscription(loaded, self.options)
            audio = self.buffer.view(0, N_SAMPLES)
            frames = min(len(audio) // HOP_LENGTH, N_SAMPLES // HOP_LENGTH)
            new = await self._tasks.enqueue(functools.partial(probe.step, audio, frames),
                                            cancellation=self.scope, label=f"whisper.tentative:{self.id}")
            return "".join(s.text for s in new)
        finally:
            self._residency.release()

