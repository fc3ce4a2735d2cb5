"""Whisper's audio encoder in small units: the log-mel, the two convolutions and each layer's queries as
chunks of the 1500 output positions, each layer's keys/values, the final norm, and the decoder's
cross-attention keys/values one decoder layer at a time (computed once per window).

A convolution output position needs only three inputs around it, and encoder self-attention's queries need
only the layer's keys/values (computed once, in their own unit), so positions [a, b) of a conv or a layer
can be computed alone. How many positions a unit covers is chosen when it runs (the scheduler sizes units
to its time budget); the result is the same whatever the sizes and whoever shares a unit (measured bitwise
equal to mlx-whisper's one-call encoder with MLX's math). On MLX's CPU backend the softmax and GELUs run in
numpy (audio/cpu_math.py: 2.1× faster per 30 s window with tiny.en), equal to the one-call encoder to
rounding, and still bitwise the same whatever the sizes and stacking. Windows at the same unit and start are
stacked on the batch axis. MLX is imported inside the functions: importing audio/ must not import mlx before
the fast BLAS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from audio import cpu_math
from audio.mel import N_FRAMES, N_SAMPLES, log_mel
from audio.pcm import SAMPLE_RATE

__all__ = ["EncoderJob", "Unit", "run_unit", "mel_window", "cross_kv", "fitted_context", "CHUNKED", "N_SAMPLES",
           "N_FRAMES"]

# ("mel",) | ("conv1", start) | ("conv2", start) | ("kv", layer) | ("layer", layer, start) | ("post",)
# | ("cross", decoder_layer) | ("done",)
Unit = tuple[Any, ...]
CHUNKED = frozenset({"conv1", "conv2", "layer"})  # kinds that cover a range of positions
_STAGES = {"mel": 0, "conv1": 1, "conv2": 2, "kv": 3, "layer": 3, "post": 4, "cross": 5, "done": 6}


def fitted_context(full: int, samples: int, min_s: float, margin_s: float = 1.0, step_s: float = 5.0) -> int:
    """Encoder positions for a window of `samples` (16 kHz) of audio: the audio plus `margin_s` of the padding
    after it, rounded up to `step_s` (few shapes, so windows stack and a GPU compiles each once), at least
    `min_s`, at most the model's `full` context (whisper.cpp's audio_ctx). Below ~10 s tiny.en loops on
    short clips (measured on the shared samples: 8 s failed one clip, 10 s none). Raises nothing."""
    per_s = full / (N_SAMPLES / SAMPLE_RATE)
    step = max(1, round(step_s * per_s))
    want = max(samples / SAMPLE_RATE + margin_s, min_s) * per_s
    return min(full, -(-int(math.ceil(want)) // step) * step)


def mel_window(model: Any, audio: np.ndarray, frames: int, fp16: bool, mel: np.ndarray | None = None) -> Any:
    """Log-mel of ≤ 30 s, zero padded to a full window and cut to `frames` of content, as transcribe() does
    (`mel`: that log-mel, computed already by audio.mel.log_mel). Engine thread only. Raises nothing of its own."""
    import mlx.core as mx

    if mel is None:
        mel = log_mel(audio, model.dims.n_mels, frames)
    return mx.array(mel).astype(mx.float16 if fp16 else mx.float32)


@dataclass(eq=False)
class EncoderJob:
    """One window on its way through the encoder; `unit` is the next piece of work. `chunk` is the default
    number of positions a chunked unit covers (the scheduler may choose fewer)."""

    audio: np.ndarray
    frames: int
    chunk: int
    fp16: bool
    mel: np.ndarray | None = None  # the window's log-mel, computed off the engine thread (None: at its unit)
    unit: Unit = ("mel",)
    x: Any = None  # (1, T, C): input of the current stage (mel, conv1 output, layer input)
    kv: Any = None  # (normed x, keys, values) of the current layer; keys/values by head on the numpy path
    parts: list[Any] = field(default_factory=list)  # finished chunks of the current chunked stage
    features: Any = None
    cross_kv: list[tuple[Any, Any]] | None = None
    # Softmax and GELU in numpy (MLX's CPU backend only, where they dominate the pass); decided when the job
    # is made, so every unit of a window computes the same way. None: chosen by the backend MLX runs on.
    numpy_math: bool | None = None
    # Encoder positions computed (None: the model's whole 30 s window; fewer: the first `n_ctx`, the padding
    # after the audio cut short, whisper.cpp's audio_ctx). Only windows of the same context stack.
    n_ctx: int | None = None

    def __post_init__(self) -> None:
        if self.numpy_math is None:
            self.numpy_math = cpu_math.numpy_math_pays()

    @property
    def done(self) -> bool:
        return self.unit[0] == "done"

    @property
    def kind(self) -> str:
        return str(self.unit[0])

    @property
    def progress(self) -> tuple[int, int]:
        """Orders jobs by how far they got: (stage, layer·positions). Raises nothing."""
        kind = self.unit[0]
        if kind == "kv":
            return _STAGES[kind], self.unit[1] * 100_000
        if kind == "layer":
            return _STAGES[kind], self.unit[1] * 100_000 + 1 + self.unit[2]
        if kind in ("conv1", "conv2", "cross"):
            return _STAGES[kind], self.unit[1]
        return _STAGES[kind], 0

    def context(self, model: Any) -> int:
        """Encoder positions this window computes. Raises nothing."""
        return self.n_ctx or int(model.dims.n_audio_ctx)

    def left(self, model: Any) -> int:
        """Positions the current chunked stage still has to cover (0 for other kinds). Raises nothing."""
        return self.context(model) - int(self.unit[-1]) if self.unit[0] in CHUNKED else 0


def _conv(conv: Any, x: Any, start: int, end: int, stride: int, numpy_math: bool) -> Any:
    """gelu(conv(x)) at output positions [start, end) of a kernel-3, padding-1 convolution: the inputs it
    needs, zero padded at the signal's edges as the full convolution pads them."""
    import mlx.core as mx
    import mlx.nn as nn

    lo, hi = start * stride - 1, (end - 1) * stride + 2
    length = x.shape[1]
    xs = x[:, max(lo, 0):min(hi, length)]
    if lo < 0 or hi > length:
        xs = mx.pad(xs, [(0, 0), (max(0, -lo), max(0, hi - length)), (0, 0)])
    y = mx.conv1d(xs, conv.weight, stride=stride, padding=0)
    if "bias" in conv:
        y = y + conv.bias
    return cpu_math.gelu_(y) if numpy_math else nn.gelu(y)


def _stack(jobs: list[EncoderJob], pick: Any) -> Any:
    import mlx.core as mx

    return mx.concatenate([pick(j) for j in jobs]) if len(jobs) > 1 else pick(jobs[0])


def _spread(jobs: list[EncoderJob], y: Any) -> list[Any]:
    return [y[i:i + 1] for i in range(len(jobs))] if len(jobs) > 1 else [y]


def _mel(model: Any, jobs: list[EncoderJob]) -> None:
    import mlx.core as mx

    mels = [mel_window(model, j.audio, j.frames, j.fp16, j.mel)[None, : 2 * j.context(model)] for j in jobs]
    mx.eval(mels)
    for j, mel in zip(jobs, mels):
        j.x, j.mel, j.unit = mel, None, ("conv1", 0)


def _chunked(model: Any, jobs: list[EncoderJob], kind: str, start: int, end: int) -> None:
    import mlx.core as mx

    enc = model.encoder
    n_ctx = jobs[0].context(model)
    if kind == "conv1":  # output frames [2·start, 2·end) of the 2·n_ctx conv1 frames
        x = _stack(jobs, lambda j: j.x)
        y = _conv(enc.conv1, x, 2 * start, 2 * end, 1, _numpy_math(jobs, x))
    elif kind == "conv2":
        x = _stack(jobs, lambda j: j.x)
        y = _conv(enc.conv2, x, start, end, 2, _numpy_math(jobs, x)) + enc._positional_embedding[start:end]
    else:
        import mlx.nn as nn

        block = enc.blocks[jobs[0].unit[1]]
        h = _stack(jobs, lambda j: j.kv[0][:, start:end])
        x = _stack(jobs, lambda j: j.x[:, start:end])
        k, v = _stack(jobs, lambda j: j.kv[1]), _stack(jobs, lambda j: j.kv[2])
        if _numpy_math(jobs, x):
            y = x + block.attn.out(_cpu_attention(block.attn, block.attn.query(h), k, v))
            y = y + block.mlp2(cpu_math.gelu_(block.mlp1(block.mlp_ln(y))))
        else:
            wv, _ = block.attn.qkv_attention(block.attn.query(h), k, v)
            y = x + block.attn.out(wv)
            y = y + block.mlp2(nn.gelu(block.mlp1(block.mlp_ln(y))))
    mx.eval(y)
    for j, part in zip(jobs, _spread(jobs, y)):
        j.parts.append(part)
        if end < n_ctx:
            j.unit = (*j.unit[:-1], end)
            continue
        whole = mx.concatenate(j.parts, axis=1) if len(j.parts) > 1 else j.parts[0]
        j.parts = []
        if kind == "conv1":
            j.x, j.unit = whole, ("conv2", 0)
        elif kind == "conv2":
            j.x, j.unit = whole, ("kv", 0)
        else:
            layer = j.unit[1]
            j.x, j.kv = whole, None
            j.unit = ("kv", layer + 1) if layer + 1 < len(enc.blocks) else ("post",)


def _numpy_math(jobs: list[EncoderJob], x: Any) -> bool:
    """Whether these jobs' layer units take the numpy path: the backend says so and the model is float32."""
    import mlx.core as mx

    return bool(jobs[0].numpy_math) and x.dtype == mx.float32


def _heads(attn: Any, k: Any, v: Any) -> tuple[Any, Any]:
    """Keys (scaled, (B, H, d, T)) and values ((B, H, T, d)) laid out by head as qkv_attention lays them out
    (same values), made contiguous once per layer instead of once per query chunk."""
    import mlx.core as mx

    b, t, d = k.shape
    scale = (d // attn.n_head) ** -0.25
    kh = k.reshape(b, t, attn.n_head, -1).transpose(0, 2, 3, 1) * scale
    return mx.contiguous(kh), mx.contiguous(v.reshape(b, t, attn.n_head, -1).transpose(0, 2, 1, 3))


def _cpu_attention(attn: Any, q: Any, kh: Any, vh: Any) -> Any:
    """qkv_attention's output with the softmax in numpy (audio/cpu_math.py), given `_heads`' keys/values."""
    b, n, d = q.shape
    scale = (d // attn.n_head) ** -0.25
    qh = q.reshape(b, n, attn.n_head, -1).transpose(0, 2, 1, 3) * scale
    w = cpu_math.softmax_(qh @ kh)
    return (w @ vh).transpose(0, 2, 1, 3).reshape(b, n, d)


def _kv(model: Any, jobs: list[EncoderJob], layer: int) -> None:
    """A layer's normed input and its keys/values over all positions, once per window (by head on the numpy
    path)."""
    import mlx.core as mx

    block = model.encoder.blocks[layer]
    h = block.attn_ln(_stack(jobs, lambda j: j.x))
    k, v = block.attn.key(h), block.attn.value(h)
    if _numpy_math(jobs, h):
        k, v = _heads(block.attn, k, v)
    mx.eval(h, k, v)
    for j, hh, kk, vv in zip(jobs, _spread(jobs, h), _spread(jobs, k), _spread(jobs, v)):
        j.kv, j.unit = (hh, kk, vv), ("layer", layer, 0)


def cross_kv(attn: Any, features: Any) -> tuple[Any, Any]:
    """A decoder layer's cross-attention keys (scaled, laid out as q @ k wants them) and values (by head),
    made contiguous once per window: qkv_attention redoes this reshaping for every token otherwise.
    Same values as mlx-whisper's. Raises nothing."""
    return _heads(attn, attn.key(features), attn.value(features))


def _post(model: Any, jobs: list[EncoderJob]) -> None:
    import mlx.core as mx

    features = model.encoder.ln_post(_stack(jobs, lambda j: j.x))
    mx.eval(features)
    for j, f in zip(jobs, _spread(jobs, features)):
        j.features, j.x, j.cross_kv, j.unit = f, None, [], ("cross", 0)


def _cross(model: Any, jobs: list[EncoderJob], layer: int) -> None:
    import mlx.core as mx

    k, v = cross_kv(model.decoder.blocks[layer].cross_attn, _stack(jobs, lambda j: j.features))
    mx.eval(k, v)
    last = layer + 1 == len(model.decoder.blocks)
    for j, kk, vv in zip(jobs, _spread(jobs, k), _spread(jobs, v)):
        assert j.cross_kv is not None
        j.cross_kv.append((kk, vv))
        j.unit = ("done",) if last else ("cross", layer + 1)


def run_unit(model: Any, jobs: list[EncoderJob], positions: int | None = None) -> None:
    """Advance every job (all at the same unit) by that unit in one stacked call, and evaluate it here so its
    cost lands in this step. A chunked unit covers `positions` (default: the first job's chunk), cut at the
    stage's end. Engine thread only. Raises what MLX raises, ValueError for a finished job."""
    unit = jobs[0].unit
    assert all(j.unit == unit and j.numpy_math == jobs[0].numpy_math and j.context(model) == jobs[0].context(model)
               for j in jobs), "jobs must share their unit and context"
    kind = unit[0]
    if kind in CHUNKED:
        start = int(unit[-1])
        _chunked(model, jobs, kind, start, min(jobs[0].context(model), start + max(1, positions or jobs[0].chunk)))
    elif kind == "mel":
        _mel(model, jobs)
    elif kind == "kv":
        _kv(model, jobs, unit[1])
    elif kind == "post":
        _post(model, jobs)
    elif kind == "cross":
        _cross(model, jobs, unit[1])
    else:
        raise ValueError(f"encoder job already done ({unit})")
