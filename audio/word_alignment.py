"""Word alignment of a live decode — where in its audio each word was said, from Whisper's cross-attention
(openai-whisper's find_alignment), so that a decode over several utterances splits its text word by word.

Whisper's segment timestamps are too coarse for that split: tiny.en's fell on whole seconds from the decode's start,
and over VAD-trimmed audio, where utterances follow each other with only their padding between them, one segment
held the words of up to five utterances (the middle one got them all, the others ''). The DTW runs in numpy, an
anti-diagonal at a time: mlx-whisper's numba one compiles for ~3.5 s on first use, on the engine thread chat shares.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from audio.pcm import SAMPLE_RATE

__all__ = ["AlignedWord", "dtw", "attention_matrix", "align_words", "token_times"]

POSITIONS_PER_SECOND = 50  # encoder positions (two mel frames each)
MEDFILT_WIDTH = 7  # openai-whisper's
SENTENCE_ENDS = ".。!！?？"


class AlignedWord(NamedTuple):
    """One word of the text: its tokens, and its start and end in seconds from the decoded audio's start."""

    word: str
    tokens: list[int]
    start: float
    end: float


def dtw(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """openai-whisper's dtw_cpu and backtrace over the cost `x` (tokens × positions): the token and the position
    index of each step of the cheapest monotone path, ties broken as it breaks them. Raises nothing."""
    n, m = x.shape
    cost = np.full((n + 1, m + 1), np.inf, np.float32)
    trace = np.full((n + 1, m + 1), -1, np.int8)
    cost[0, 0] = 0
    x = x.astype(np.float32, copy=False)
    for d in range(2, n + m + 1):  # cell (i, j) needs (i-1, j-1), (i-1, j) and (i, j-1): the two diagonals before
        i = np.arange(max(1, d - m), min(n, d - 1) + 1)
        j = d - i
        c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
        t = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2))
        cost[i, j] = x[i - 1, j - 1] + np.choose(t, [c0, c1, c2])
        trace[i, j] = t
    trace[0, :] = 2
    trace[:, 0] = 1
    steps: list[tuple[int, int]] = []
    i, j = n, m
    while i > 0 or j > 0:
        steps.append((i - 1, j - 1))
        t = trace[i, j]
        i, j = (i - 1, j - 1) if t == 0 else (i - 1, j) if t == 1 else (i, j - 1)
    path = np.array(steps[::-1], dtype=np.int64).reshape(-1, 2)
    return path[:, 0], path[:, 1]


def attention_matrix(model: Any, tokenizer: Any, text_tokens: list[int], features: Any, frames: int) -> np.ndarray:
    """openai-whisper's alignment matrix: the alignment heads' normalized, median-filtered cross-attention of
    `text_tokens` (and the end of text) over the first `frames` mel frames of the encoder output `features`, one
    row per token. Engine thread (MLX). Raises what MLX raises."""
    import mlx.core as mx
    from mlx_whisper.timing import median_filter

    sot = list(tokenizer.sot_sequence)
    tokens = mx.array([*sot, tokenizer.no_timestamps, *text_tokens, tokenizer.eot])
    _, _, cross_qk = model.decoder(tokens[None], features)
    weights = mx.stack([cross_qk[layer][0, head] for layer, head in model.alignment_heads.tolist()])
    weights = mx.softmax(weights[:, :, :frames // 2], axis=-1, precise=True).astype(mx.float32)
    mean = mx.mean(weights, axis=-2, keepdims=True)
    std = mx.var(weights, axis=-2, keepdims=True, ddof=0).sqrt()
    filtered = median_filter(np.array((weights - mean) / std), MEDFILT_WIDTH)
    return np.asarray(filtered.mean(axis=0)[len(sot):-1])


def align_words(model: Any, tokenizer: Any, text_tokens: list[int], features: Any, frames: int) -> list[AlignedWord]:
    """The words of `text_tokens` (the tokenizer's split) with their times, aligned over `frames` mel frames of
    `features`; [] for no text or a single word. Engine thread (MLX). Raises what MLX raises."""
    if not text_tokens:
        return []
    text_index, position = dtw(-attention_matrix(model, tokenizer, text_tokens, features, frames))
    words, word_tokens = tokenizer.split_to_word_tokens(text_tokens + [tokenizer.eot])
    if len(word_tokens) <= 1:
        return []
    bounds = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_index), (1, 0), constant_values=1).astype(bool)
    times = position[jumps] / POSITIONS_PER_SECOND
    aligned = [AlignedWord(w, list(t), float(times[a]), float(times[b]))
               for w, t, a, b in zip(words, word_tokens, bounds[:-1], bounds[1:])]
    return _cut_long(aligned)


def _cut_long(words: list[AlignedWord]) -> list[AlignedWord]:
    """openai-whisper's cut of words aligned over a pause (add_word_timestamps): at most twice the median word
    (itself at most 0.7 s) for a full stop and the word after it, and for the first word (the decode's audio may
    begin in the pause before it). Stretched back over the pause, "Unless" went to the sentence before it. Raises
    nothing."""
    durations = [w.end - w.start for w in words if w.end > w.start]
    if not durations:
        return words
    longest = 2 * min(0.7, float(np.median(durations)))
    out = list(words)
    for i, w in enumerate(out):
        if w.end - w.start <= longest:
            continue
        if i and w.word in SENTENCE_ENDS:
            out[i] = w._replace(end=w.start + longest)
        elif i == 0 or out[i - 1].word in SENTENCE_ENDS:
            out[i] = w._replace(start=w.end - longest)
    return out


def token_times(words: list[AlignedWord], tokens: list[int], eot: int, seek: int) -> list[float | None] | None:
    """For each of `tokens` (a decode from compact sample `seek`), the compact sample its word was said at (the
    word's middle; punctuation goes with the word before it), None for timestamps and other special tokens; None
    when `words` do not spell out `tokens`' text. Raises nothing."""
    said: list[float] = []
    for w in words:
        at = seek + (w.start + w.end) / 2 * SAMPLE_RATE
        if said and not any(c.isalnum() for c in w.word):
            at = said[-1]  # a full stop aligned over the pause after it could land in the next utterance
        said.extend([at] * len(w.tokens))
    if not said or len(said) != sum(1 for t in tokens if t < eot):
        return None
    it = iter(said)
    return [next(it) if t < eot else None for t in tokens]
