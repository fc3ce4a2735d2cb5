"""Whisper's audio encoder in bounded units: the mel and conv front, then each layer as query chunks, then
the final norm and the decoder's cross-attention keys/values (computed once per window).

Encoder self-attention is bidirectional, so a layer's keys/values need the whole previous layer; its queries
do not: layer l over positions [a, b) needs only layer l-1's output and those positions. Chunk bounds are fixed
per window, and windows at the same unit are stacked on the batch axis, so a window's features do not depend
on who shared its steps (measured bitwise equal to mlx-whisper's one-call encoder on CPU). MLX is imported
inside the functions: importing audio/ must not import mlx before the fast BLAS is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["EncoderJob", "Unit", "run_unit", "mel_window", "cross_kv", "N_SAMPLES", "N_FRAMES"]

SAMPLE_RATE = 16000
N_SAMPLES = 30 * SAMPLE_RATE
N_FRAMES = 3000

Unit = tuple[Any, ...]  # ("front",) | ("layer", l, start) | ("post",) | ("done",)


def mel_window(model: Any, audio: np.ndarray, frames: int, fp16: bool) -> Any:
    """Log-mel of ≤ 30 s, zero padded to a full window and cut to `frames` of content, as transcribe() does.
    Engine thread only. Raises nothing of its own."""
    import mlx.core as mx
    from mlx_whisper.audio import log_mel_spectrogram, pad_or_trim

    mel = log_mel_spectrogram(audio[:N_SAMPLES], n_mels=model.dims.n_mels, padding=max(0, N_SAMPLES - len(audio)))
    return pad_or_trim(mel[:frames], N_FRAMES, axis=-2).astype(mx.float16 if fp16 else mx.float32)


@dataclass(eq=False)
class EncoderJob:
    """One window on its way through the encoder; `unit` is the next piece of work."""

    audio: np.ndarray
    frames: int
    chunk: int  # query positions per layer unit; fixed for the window's life
    fp16: bool
    unit: Unit = ("front",)
    x: Any = None  # (1, n_audio_ctx, D): input of the current layer
    kv: Any = None  # (normed x, keys, values) of the current layer
    parts: list[Any] = field(default_factory=list)  # finished query chunks of the current layer
    features: Any = None
    cross_kv: list[tuple[Any, Any]] | None = None

    @property
    def done(self) -> bool:
        return self.unit[0] == "done"

    @property
    def progress(self) -> tuple[int, int]:
        """Orders jobs by how far they got: (stage, layer·positions). Raises nothing."""
        kind = self.unit[0]
        if kind == "layer":
            return 1, self.unit[1] * 100_000 + self.unit[2]
        return {"front": 0, "post": 2, "done": 3}[kind], 0


def _front(model: Any, jobs: list[EncoderJob]) -> None:
    import mlx.core as mx
    import mlx.nn as nn

    enc = model.encoder
    mels = [mel_window(model, j.audio, j.frames, j.fp16)[None] for j in jobs]
    x = mx.concatenate(mels) if len(mels) > 1 else mels[0]
    x = nn.gelu(enc.conv1(x))
    x = nn.gelu(enc.conv2(x))
    x = x + enc._positional_embedding
    mx.eval(x)
    for i, j in enumerate(jobs):
        j.x = x[i:i + 1] if len(jobs) > 1 else x
        j.unit = ("layer", 0, 0)


def _layer(model: Any, jobs: list[EncoderJob], layer: int, start: int) -> None:
    import mlx.core as mx
    import mlx.nn as nn

    block = model.encoder.blocks[layer]
    n_ctx = model.dims.n_audio_ctx
    stacked = len(jobs) > 1
    if start == 0:  # keys/values of the whole layer, once
        x = mx.concatenate([j.x for j in jobs]) if stacked else jobs[0].x
        h = block.attn_ln(x)
        k, v = block.attn.key(h), block.attn.value(h)
        mx.eval(h, k, v)
        for i, j in enumerate(jobs):
            j.kv = (h[i:i + 1], k[i:i + 1], v[i:i + 1]) if stacked else (h, k, v)
    chunk = jobs[0].chunk
    end = min(n_ctx, start + chunk)

    def stack(pick: Any) -> Any:
        return mx.concatenate([pick(j) for j in jobs]) if stacked else pick(jobs[0])

    h = stack(lambda j: j.kv[0][:, start:end])
    x = stack(lambda j: j.x[:, start:end])
    wv, _ = block.attn.qkv_attention(block.attn.query(h), stack(lambda j: j.kv[1]), stack(lambda j: j.kv[2]))
    y = x + block.attn.out(wv)
    y = y + block.mlp2(nn.gelu(block.mlp1(block.mlp_ln(y))))
    mx.eval(y)
    for i, j in enumerate(jobs):
        j.parts.append(y[i:i + 1] if stacked else y)
        if end < n_ctx:
            j.unit = ("layer", layer, end)
            continue
        j.x = mx.concatenate(j.parts, axis=1) if len(j.parts) > 1 else j.parts[0]
        j.parts, j.kv = [], None
        j.unit = ("layer", layer + 1, 0) if layer + 1 < len(model.encoder.blocks) else ("post",)


def cross_kv(attn: Any, features: Any) -> tuple[Any, Any]:
    """A decoder layer's cross-attention keys (scaled, laid out as q @ k wants them) and values (by head),
    made contiguous once per window: qkv_attention redoes this reshaping for every token otherwise.
    Same values as mlx-whisper's. Raises nothing."""
    import mlx.core as mx

    b, t, d = features.shape
    scale = (d // attn.n_head) ** -0.25
    k = attn.key(features).reshape(b, t, attn.n_head, -1).transpose(0, 2, 3, 1) * scale
    v = attn.value(features).reshape(b, t, attn.n_head, -1).transpose(0, 2, 1, 3)
    return mx.contiguous(k), mx.contiguous(v)


def _post(model: Any, jobs: list[EncoderJob]) -> None:
    import mlx.core as mx

    x = mx.concatenate([j.x for j in jobs]) if len(jobs) > 1 else jobs[0].x
    features = model.encoder.ln_post(x)
    cross = [cross_kv(b.cross_attn, features) for b in model.decoder.blocks]
    mx.eval(features, cross)
    for i, j in enumerate(jobs):
        sl = slice(i, i + 1)
        j.features = features[sl] if len(jobs) > 1 else features
        j.cross_kv = [(k[sl], v[sl]) if len(jobs) > 1 else (k, v) for k, v in cross]
        j.x = None
        j.unit = ("done",)


def run_unit(model: Any, jobs: list[EncoderJob]) -> None:
    """Advance every job (all at the same unit, same chunk size) by that unit in one stacked call, and
    evaluate it here so its cost lands in this step. Engine thread only. Raises what MLX raises."""
    unit = jobs[0].unit
    assert all(j.unit == unit and j.chunk == jobs[0].chunk for j in jobs), "jobs must share their unit"
    if unit[0] == "front":
        _front(model, jobs)
    elif unit[0] == "layer":
        _layer(model, jobs, unit[1], unit[2])
    elif unit[0] == "post":
        _post(model, jobs)
    else:
        raise ValueError(f"encoder job already done ({unit})")
