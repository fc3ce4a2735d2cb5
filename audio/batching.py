"""Batched window encoding: cut a file into ≤ 30 s chunks at silences and decode several chunks per task.

The sequential seek loop (audio/decoding.py) must finish a window before it knows where the next starts;
chunks cut at VAD silences are independent, so B of them share one encoder and one decoder call — the
accelerator's speed path (cf. faster-whisper's BatchedInferencePipeline). The price: no conditioning on
the previous chunk's text, and a task that holds the loop for B windows instead of one.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, AsyncIterator

import numpy as np

from audio.decoding import HOP_LENGTH, N_SAMPLES, WindowedTranscription
from audio.transcript import Segment
from audio.vad import speech_segments

if TYPE_CHECKING:
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


async def batched_windows(tr: WindowedTranscription, pcm: np.ndarray, batch_size: int,
                          tasks: "ExecutionTasks") -> AsyncIterator[list[Segment]]:
    """Decode `pcm` as VAD-cut chunks, `batch_size` chunks per task; yields each batch's segments.
    Raises what the window tasks raise."""
    chunks = [(pcm[a:b], (b - a) // HOP_LENGTH, a // HOP_LENGTH) for a, b in
              plan_chunks(pcm, min_speech_ms=tr.options.vad_min_speech_ms)]
    chunks = [c for c in chunks if c[1] > 0]
    for i in range(0, len(chunks), batch_size):
        batch = chunks[i:i + batch_size]
        new = await tasks.run(functools.partial(tr.step_batch, batch), label=f"whisper.batch[{len(batch)}]")
        if new:
            yield new
