"""A whole signal's transcription (the file routes, `tandem transcribe`): its speech found by VAD, then Whisper's
windows one after another (or batched), each window's new segments yielded as they come, the Transcript last."""

from __future__ import annotations

import functools
from contextlib import aclosing
from typing import TYPE_CHECKING, AsyncGenerator

import anyio
import numpy as np

from audio.batching import batched_windows
from audio.decoding import N_SAMPLES, WindowedTranscription
from audio.exception_frames import FramesReleased
from audio.mel import signal_ceiling
from audio.pcm import SAMPLE_RATE
from audio.scheduler import WhisperScheduler
from audio.timeline import compact
from audio.transcript import Segment, TokenCounts, TranscribeOptions, Transcript
from audio.vad import speech_pieces
from audio.whisper import WhisperResidency

if TYPE_CHECKING:
    from engine.tasks import ExecutionTasks

__all__ = ["BREAK_GAP_S", "transcribe_stream"]

# A file's windows end where speech resumes after this much removed silence (audio/decoding.py `break_gap`): a
# segment, and so a subtitle, never spans it. Each such gap costs at most one more window.
BREAK_GAP_S = 2.0

async def transcribe_stream(pcm: np.ndarray, options: TranscribeOptions, residency: WhisperResidency,
                            scheduler: WhisperScheduler,
                            tasks: "ExecutionTasks") -> AsyncGenerator[list[Segment] | Transcript, None]:
    """Decode a whole signal window by window: yields each window's new segments, then the final Transcript.
    With `vad` Whisper sees only the speech (no speech: an empty Transcript, Whisper never loaded).
    Raises WhisperCheckpointError (load), TaskRejected (shutdown), MLX errors from a window."""
    windows = _transcribe(pcm, options, residency, scheduler, tasks)
    async with aclosing(windows):
        with FramesReleased():  # cancelled (a client gone), the frames holding the model go without it
            async for item in windows:
                yield item


async def _transcribe(pcm: np.ndarray, options: TranscribeOptions, residency: WhisperResidency,
                      scheduler: WhisperScheduler,
                      tasks: "ExecutionTasks") -> AsyncGenerator[list[Segment] | Transcript, None]:
    duration = len(pcm) / SAMPLE_RATE
    empty = Transcript("", options.named_language, duration, options.task, logprobs=() if options.logprobs else None,
                       tokens=TokenCounts(prompt=0, audio=0, output=0))  # Whisper read nothing
    timeline = None
    if options.vad or options.vad_trim:
        pieces = await anyio.to_thread.run_sync(functools.partial(speech_pieces, pcm, **options.gate_settings))
        if pieces and not options.vad:
            pieces = [(pieces[0][0], pieces[-1][1])]
        pcm, timeline = compact(pcm, pieces)
    if len(pcm) == 0:
        yield empty
        return
    loaded = await residency.take()
    try:
        tr = await WindowedTranscription.start(loaded, options, timeline=timeline)
        tr.break_gap = BREAK_GAP_S
        # transcribe() floors every window's log-mel below the whole signal's peak (audio/mel.py)
        tr.mel_ceiling = await anyio.to_thread.run_sync(signal_ceiling, pcm, loaded.model.dims.n_mels)
        if options.batch_size > 1:
            async for new in batched_windows(tr, pcm, options.batch_size, scheduler, tasks):
                yield new
        else:
            while (window := tr.next_window(len(pcm), final=True)) is not None:
                start, frames = window
                new = await tr.step(pcm[start: start + N_SAMPLES], frames, scheduler, tasks)
                if new:
                    yield new
        done = tr.transcript(duration)
        done.tokens = tr.token_counts(len(pcm))  # the audio the windows were given: with VAD, the speech only
        yield done
    finally:
        residency.release()
