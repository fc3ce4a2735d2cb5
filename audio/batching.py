"""Batched windows: cut a file into ≤ 30 s chunks at silences and decode several chunks at once.

The sequential seek loop (audio/decoding.py) must finish a window before it knows where the next starts;
chunks cut at VAD silences are independent, so B of them are in flight together and share the scheduler's
encoder and decoder steps — the accelerator's speed path (cf. faster-whisper's BatchedInferencePipeline).
The price: no conditioning on the previous chunk's text (a chunk's later windows are conditioned on its own).
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import TYPE_CHECKING, AsyncIterator

import anyio
import numpy as np

from audio.exception_frames import start_released
from audio.decoding import HOP_LENGTH, N_FRAMES, N_SAMPLES, WindowedTranscription, segment_end
from audio.token_logprobs import kept_logprobs
from audio.pcm import SAMPLE_RATE
from audio.window import WindowResult
from audio.transcript import Segment
from audio.vad import speech_segments

if TYPE_CHECKING:
    from audio.scheduler import WhisperScheduler
    from engine.tasks import ExecutionTasks

__all__ = ["plan_chunks", "batched_windows"]


def plan_chunks(pcm: np.ndarray, *, max_samples: int = N_SAMPLES, min_speech_ms: int = 250) -> list[tuple[int, int]]:
    """[start, end) sample ranges ≤ max_samples: VAD speech runs packed greedily, cut in the silences between
    them; a run longer than a window is cut hard. No speech found → fixed windows over everything.
    Raises nothing."""
    runs = speech_segments(pcm, min_speech_ms=min_speech_ms, padding_ms=200)
    if not runs:
        return [(a, min(len(pcm), a + max_samples)) for a in range(0, len(pcm), max_samples)]
    pieces: list[tuple[int, int]] = []
    for a, b in runs:
        pieces.extend((x, min(b, x + max_samples)) for x in range(a, b, max_samples))
    chunks: list[tuple[int, int]] = []
    for a, b in pieces:
        if chunks and b - chunks[-1][0] <= max_samples:
            chunks[-1] = (chunks[-1][0], b)
        else:
            chunks.append((a, b))
    return chunks


async def _decode_chunk(tr: WindowedTranscription, scheduler: "WhisperScheduler", audio: np.ndarray, frames: int,
                        out: list[tuple[int, int, WindowResult]]) -> None:
    """A chunk's windows, from its start until it is consumed, into `out`: (frames into the chunk, frames in the
    window, result). A function of its own, not a closure over `tr`: a cancelled task's frames keep their function."""
    local = 0
    context = list(tr.initial_prompt_tokens)  # a chunk's later windows are conditioned on its own text
    room = tr.loaded.model.dims.n_text_ctx // 2 - 1
    while local < frames:
        n = min(N_FRAMES, frames - local)
        piece = audio[local * HOP_LENGTH: local * HOP_LENGTH + N_SAMPLES]
        request = tr.request(piece, n, conditioned=False)
        if local > 0:
            request = replace(request, prompt=tuple(context[-room:]) if room > 0 else ())
        result = await scheduler.decode(tr.loaded, request)
        out.append((local, n, result))
        if tr.silent(result):
            advance = n
        else:
            segments, advance, _ = tr.split(result.decoded.tokens, result, 0.0, n)
            context.extend(t for s in segments if s["start"] != s["end"] and s["text"].strip()
                           for t in s["tokens"])
            if not tr.options.condition_on_previous_text or result.decoded.temperature > 0.5:
                context = []  # as the seek loop: no conditioning on text sampled hot
        local += advance if advance > 0 else n  # never the same window twice


async def batched_windows(tr: WindowedTranscription, pcm: np.ndarray, batch_size: int, scheduler: "WhisperScheduler",
                          tasks: "ExecutionTasks") -> AsyncIterator[list[Segment]]:
    """Decode `pcm` as VAD-cut chunks, `batch_size` of them in flight together (the scheduler batches their
    steps); yields each batch's segments in order. Within a chunk the seek loop is Whisper's: a decode that stops
    before the chunk's end (its last segment unfinished, or its text ended early) is followed by one from its last
    complete segment, until the chunk is consumed (decoded once, a chunk lost the speech after the last complete
    segment: a whole sentence of the probe's 31 s file). Raises what the windows raise."""
    chunks = [(pcm[a:b], (b - a) // HOP_LENGTH, a // HOP_LENGTH) for a, b in
              plan_chunks(pcm, min_speech_ms=tr.options.vad_min_speech_ms)]
    chunks = [c for c in chunks if c[1] > 0]
    for i in range(0, len(chunks), batch_size):
        batch = chunks[i:i + batch_size]
        # per chunk: (frames into the chunk, frames in the window, result) of each window decoded
        windows: list[list[tuple[int, int, WindowResult]]] = [[] for _ in batch]

        async with anyio.create_task_group() as tg:
            for k, (audio, frames, _) in enumerate(batch):  # cancelled, each keeps no frame that reaches the model
                start_released(tg, functools.partial(_decode_chunk, tr, scheduler, audio, frames, windows[k]))
        new: list[Segment] = []
        for (_, _, start), decoded in zip(batch, windows):
            for local, frames, result in decoded:
                tr.adopt(result)
                tr.windows += 1
                if tr.silent(result):
                    continue
                tr.seek = start + local  # segments record the window they came from
                offset = tr.seek * HOP_LENGTH / SAMPLE_RATE
                current, _, _ = tr.split(result.decoded.tokens, result, offset, frames, logprobs=kept_logprobs(result))
                if tr.options.word_timestamps and current:
                    await tr.align(current, result, frames, tasks)
                    tr.last_speech_timestamp = segment_end(current) or tr.last_speech_timestamp
                new.extend(tr.commit(current))
        tr.seek = max(start + frames for _, frames, start in batch)
        if new:
            yield new
