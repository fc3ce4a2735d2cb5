"""audio/encoder.py: the encoder in units equals mlx-whisper's one-call encoder, whatever the sizes of its
chunks (fixed or chosen unit by unit) and whoever shares a unit — bitwise with MLX's own math, to rounding
with the CPU backend's numpy softmax/GELU (audio/cpu_math.py), whose results are bitwise the same whatever
the chunks and stacking. Bitwise where the matmuls are row-stable: OpenBLAS picks its kernels and blocking by
a call's rows, so on some CPUs (AVX-512 here) a row's result depends on the rows beside it, to ~1e-6."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from audio.encoder import EncoderJob, cross_kv, fitted_context, mel_window, run_unit
from audio.whisper import LoadedWhisper
from engine.backend import blas_info

# See the module doc; a GPU's matmuls (cuBLAS) pick kernels by shape too: chunks there equal the one call to rounding.
ROW_STABLE = blas_info().name != "openblas" and mx.default_device().type == mx.DeviceType.cpu


def noise(seconds: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.1, int(seconds * 16000)).astype(np.float32)


def encode(model: object, jobs: list[EncoderJob], sizes: list[int] | None = None) -> int:
    """Run units until every job is done, stacking jobs at the same unit; chunked units take the next of
    `sizes` (cycled) when given. Returns the units run."""
    units = 0
    while not all(j.done for j in jobs):
        head = next(j for j in jobs if not j.done)
        size = sizes[units % len(sizes)] if sizes else None
        run_unit(model, [j for j in jobs if j.unit == head.unit], size)
        units += 1
    return units


def same_as_one_call(got: mx.array, reference: mx.array, numpy_math: bool) -> bool:
    # numpy's exp/erf and its summation order round differently from MLX's kernels: the numpy path matches
    # the one-call encoder to rounding (measured max |diff| ~1e-6 on the tiny test model, 2e-4 on tiny.en
    # whose features reach 12), MLX's own math matches it bitwise.
    if numpy_math:
        return bool(mx.allclose(got, reference, rtol=1e-5, atol=1e-5).item())
    return same(got, reference)


def same(a: mx.array, b: mx.array) -> bool:
    """Bitwise where the matmuls are row-stable, else to OpenBLAS's rounding (module doc)."""
    return bool(mx.array_equal(a, b).item() if ROW_STABLE else mx.allclose(a, b, rtol=1e-5, atol=1e-5).item())


MATH = pytest.mark.parametrize("numpy_math", [False, True], ids=["mlx-math", "numpy-math"])


@MATH
@pytest.mark.parametrize("chunk", [1500, 375, 500, 1000])
def test_units_equal_the_one_call_encoder(tiny_whisper: LoadedWhisper, chunk: int, numpy_math: bool) -> None:
    model = tiny_whisper.model
    audio = noise(7, seed=1)
    job = EncoderJob(audio, 700, chunk, fp16=False, numpy_math=numpy_math)
    units = encode(model, [job])
    layers, chunks = len(model.encoder.blocks), -(-1500 // chunk)
    decoder_layers = len(model.decoder.blocks)
    # mel, conv1 and conv2 chunks, per layer its keys/values and query chunks, the norm, each cross-attention
    assert units == 1 + 2 * chunks + layers * (1 + chunks) + 1 + decoder_layers
    reference = model.encoder(mel_window(model, audio, 700, fp16=False)[None])
    assert same_as_one_call(job.features, reference, numpy_math)
    assert job.x is None and job.kv is None and job.parts == []
    for block, (k, v) in zip(model.decoder.blocks, job.cross_kv):
        ek, ev = cross_kv(block.cross_attn, reference)
        assert same_as_one_call(k, ek, numpy_math) and same_as_one_call(v, ev, numpy_math)


@MATH
def test_units_sized_one_by_one_equal_the_one_call_encoder(tiny_whisper: LoadedWhisper, numpy_math: bool) -> None:
    # The scheduler sizes paced units in multiples of 64 positions, chosen unit by unit: the same bits as
    # the full-budget chunks, so pacing never changes a transcript.
    model = tiny_whisper.model
    audio = noise(5, seed=2)
    job = EncoderJob(audio, 500, 375, fp16=False, numpy_math=numpy_math)
    encode(model, [job], sizes=[64, 128, 320, 1500])
    reference = model.encoder(mel_window(model, audio, 500, fp16=False)[None])
    assert same_as_one_call(job.features, reference, numpy_math)
    unpaced = EncoderJob(audio, 500, 375, fp16=False, numpy_math=numpy_math)
    encode(model, [unpaced])
    assert same(job.features, unpaced.features)


@MATH
def test_stacked_windows_equal_windows_alone(tiny_whisper: LoadedWhisper, numpy_math: bool) -> None:
    model = tiny_whisper.model
    clips = [(noise(s, seed=s), int(s * 100)) for s in (3, 12, 30)]
    together = [EncoderJob(a, f, 375, fp16=False, numpy_math=numpy_math) for a, f in clips]
    encode(model, together)  # all three advance in lockstep: every unit is one stacked call
    for (audio, frames), job in zip(clips, together):
        alone = EncoderJob(audio, frames, 375, fp16=False, numpy_math=numpy_math)
        encode(model, [alone])
        assert same(alone.features, job.features)
        for (k1, v1), (k2, v2) in zip(alone.cross_kv, job.cross_kv):
            assert same(k1, k2) and same(v1, v2)


def test_the_backend_chooses_the_math(tiny_whisper: LoadedWhisper) -> None:
    # numpy only where MLX computes on the CPU; on a GPU the encoder keeps MLX's kernels.
    on_cpu = mx.default_device().type == mx.DeviceType.cpu
    assert EncoderJob(noise(1, 0), 100, 375, False).numpy_math is on_cpu


def test_cross_kv_holds_the_decoders_keys_and_values(tiny_whisper: LoadedWhisper) -> None:
    model = tiny_whisper.model
    features = mx.random.normal((1, 1500, model.dims.n_audio_state))
    attn = model.decoder.blocks[0].cross_attn
    k, v = cross_kv(attn, features)
    heads, d = attn.n_head, model.dims.n_text_state // attn.n_head
    assert k.shape == (1, heads, d, 1500) and v.shape == (1, heads, 1500, d)
    expected_v = attn.value(features).reshape(1, 1500, heads, d).transpose(0, 2, 1, 3)
    assert mx.array_equal(v, expected_v).item()


def test_a_unit_refuses_jobs_at_different_units(tiny_whisper: LoadedWhisper) -> None:
    a, b = EncoderJob(noise(1, 0), 100, 375, False), EncoderJob(noise(1, 1), 100, 375, False)
    run_unit(tiny_whisper.model, [a])
    with pytest.raises(AssertionError):
        run_unit(tiny_whisper.model, [a, b])
    c = EncoderJob(noise(1, 2), 100, 375, False, numpy_math=not a.numpy_math)
    run_unit(tiny_whisper.model, [c])
    with pytest.raises(AssertionError):  # one stacked call computes one way
        run_unit(tiny_whisper.model, [a, c])


def one_call_over(model: object, mel: mx.array, n_ctx: int) -> mx.array:
    """mlx-whisper's encoder over the first 2·n_ctx mel frames, its positional embedding cut to match."""
    import mlx.nn as nn

    enc = model.encoder  # type: ignore[attr-defined]
    x = nn.gelu(enc.conv2(nn.gelu(enc.conv1(mel[:, : 2 * n_ctx])))) + enc._positional_embedding[:n_ctx]
    for block in enc.blocks:
        x, _, _ = block(x)
    return enc.ln_post(x)


@MATH
@pytest.mark.parametrize("chunk", [375, 64])
def test_a_cut_context_equals_the_one_call_encoder_over_its_first_positions(tiny_whisper: LoadedWhisper,
                                                                             chunk: int, numpy_math: bool) -> None:
    model = tiny_whisper.model
    audio = noise(4, seed=3)
    mel = mel_window(model, audio, 400, fp16=False)[None]
    assert same(one_call_over(model, mel, 1500), model.encoder(mel))  # the reference is the encoder's math
    job = EncoderJob(audio, 400, chunk, fp16=False, numpy_math=numpy_math, n_ctx=500)
    encode(model, [job])
    assert job.features.shape == (1, 500, model.dims.n_audio_state)
    assert same_as_one_call(job.features, one_call_over(model, mel, 500), numpy_math)
    for k, _ in job.cross_kv:
        assert k.shape[-1] == 500  # the decoder attends to the cut context only


def test_windows_of_different_contexts_never_share_a_unit(tiny_whisper: LoadedWhisper) -> None:
    a = EncoderJob(noise(1, 0), 100, 375, False, n_ctx=500)
    b = EncoderJob(noise(1, 1), 100, 375, False, n_ctx=750)
    c = EncoderJob(noise(1, 2), 100, 375, False)
    with pytest.raises(AssertionError):
        run_unit(tiny_whisper.model, [a, b])
    with pytest.raises(AssertionError):
        run_unit(tiny_whisper.model, [a, c])
    run_unit(tiny_whisper.model, [a, EncoderJob(noise(1, 3), 100, 375, False, n_ctx=500)])


@pytest.mark.parametrize(("seconds", "min_s", "positions"), [
    (2.0, 10.0, 500),   # short speech: the 10 s floor
    (9.0, 10.0, 500),   # 9 s + 1 s of padding fits exactly
    (9.5, 10.0, 750),   # 10.5 s rounds up to the next 5 s
    (20.0, 10.0, 1250),
    (29.5, 10.0, 1500),  # never more than the model's window
    (1.0, 0.0, 250),    # no floor: 2 s rounds up to 5 s
])
def test_a_fitted_context_covers_the_audio_and_a_second_in_steps_of_five(seconds: float, min_s: float,
                                                                        positions: int) -> None:
    assert fitted_context(1500, int(seconds * 16000), min_s) == positions
