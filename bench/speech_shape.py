"""Speech on an accelerator with a random-init checkpoint of a real shape (e.g. large-v3-turbo), no hub.

Same file, same weights, greedy without fallback on both sides (so both decode the same tokens):
`mlx_whisper.transcribe` vs mlx-tandem's window tasks, sequential and batched (N windows per encoder call).

    python -m bench.speech_shape --samples DIR --shape large-v3-turbo --repeats 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
import wave
from pathlib import Path

from engine.backend import ensure_fast_blas

ensure_fast_blas()  # a script entry point: the fast BLAS must be loaded before mlx is imported below

import anyio
import numpy as np

from audio.pcm import SAMPLE_RATE

__all__ = ["main", "SHAPES"]

SR = SAMPLE_RATE
SHAPES = {
    "large-v3-turbo": dict(n_mels=128, n_audio_ctx=1500, n_audio_state=1280, n_audio_head=20, n_audio_layer=32,
                           n_vocab=51866, n_text_ctx=448, n_text_state=1280, n_text_head=20, n_text_layer=4),
    "tiny": dict(n_mels=80, n_audio_ctx=1500, n_audio_state=384, n_audio_head=6, n_audio_layer=4,
                 n_vocab=51865, n_text_ctx=448, n_text_state=384, n_text_head=6, n_text_layer=4),
}


def _wav(path: Path) -> np.ndarray:
    """16-bit mono WAV → float32 (stdlib only, so the GPU host needs no PyAV)."""
    with wave.open(str(path)) as w:
        assert w.getframerate() == SR and w.getnchannels() == 1 and w.getsampwidth() == 2
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768.0


def joined(samples: Path, gap_s: float, repeat: int) -> np.ndarray:
    gap = np.zeros(int(gap_s * SR), np.float32)
    one = np.concatenate([np.concatenate([_wav(w), gap]) for w in sorted(samples.glob("*.wav"))])
    return np.concatenate([one] * repeat)


def build_checkpoint(shape: str, directory: Path, dtype: str) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.fixtures.tiny_whisper import build_tiny_whisper

    build_tiny_whisper(directory, dims=SHAPES[shape])
    if dtype != "float32":  # store as the serving dtype so both sides load the same tensors
        import mlx.core as mx

        w = mx.load(str(directory / "weights.safetensors"))
        mx.save_safetensors(str(directory / "weights.safetensors"), {k: v.astype(getattr(mx, dtype)) for k, v in w.items()})
    return directory


def main(argv: list[str] | None = None) -> int:
    """Prints one JSON document. Raises SystemExit on bad options."""
    p = argparse.ArgumentParser(prog="tandem benchmark speech-shape")
    p.add_argument("--samples", default=None, help="the clips to transcribe (required unless --build-only)")
    p.add_argument("--build-only", type=Path, default=None, metavar="DIR",
                   help="only write the random-init checkpoint to DIR (in --dtype) and exit")
    p.add_argument("--shape", default="large-v3-turbo", choices=sorted(SHAPES))
    p.add_argument("--dtype", default=None, help="default: float16 on GPU/Metal, float32 on CPU")
    p.add_argument("--gap", type=float, default=6.0)
    p.add_argument("--repeat", type=int, default=2, help="concatenate the joined clips this many times")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-sizes", default="4,8")
    a = p.parse_args(argv)
    if a.build_only is not None:
        build_checkpoint(a.shape, a.build_only, a.dtype or "float16")
        print(json.dumps({"checkpoint": str(a.build_only), "shape": a.shape, "dtype": a.dtype or "float16"}))
        return 0
    if a.samples is None:
        p.error("--samples is required")

    import mlx_whisper

    from audio.speech import SpeechService
    from audio.whisper import default_dtype
    from engine.runtime import Engine

    dtype = a.dtype or default_dtype()
    ckpt = build_checkpoint(a.shape, Path(tempfile.mkdtemp()) / a.shape, dtype)
    pcm = joined(Path(a.samples), a.gap, a.repeat)
    audio_s = len(pcm) / SR
    fp16 = dtype == "float16"

    def theirs() -> float:
        t0 = time.perf_counter()
        mlx_whisper.transcribe(pcm, path_or_hf_repo=str(ckpt), fp16=fp16, language="en", temperature=0.0,
                               condition_on_previous_text=True)
        return time.perf_counter() - t0

    engine_ = Engine(None)
    speech = SpeechService(engine_.tasks, ckpt, dtype=dtype, resident=True)
    options = dataclasses.replace(speech.options(language="en"), temperatures=(0.0,))
    result: dict = {"device": None, "shape": a.shape, "dtype": dtype, "audio_s": round(audio_s, 1)}

    async def run() -> None:
        import mlx.core as mx

        result["device"] = str(mx.default_device())
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine_.serve)
            await speech.residency.preload()
            await speech.transcribe(pcm[: SR * 31], options)  # warm-up (kernel JIT for these shapes)
            mlx_whisper.transcribe(pcm[: SR * 31], path_or_hf_repo=str(ckpt), fp16=fp16, language="en", temperature=0.0)
            ours, ref = [], []
            for r in range(a.repeats):
                t0 = time.perf_counter()
                await speech.transcribe(pcm, options)
                ours.append(time.perf_counter() - t0)
                ref.append(theirs())
            result["mlx_whisper_s"] = round(statistics.median(ref), 3)
            result["tandem_s"] = round(statistics.median(ours), 3)
            result["tandem_over_mlx_whisper"] = round(result["tandem_s"] / result["mlx_whisper_s"], 3)
            for b in [int(x) for x in a.batch_sizes.split(",")]:
                opts = dataclasses.replace(options, batch_size=b)
                await speech.transcribe(pcm[: SR * 60], opts)  # warm-up for the batch shape
                times = []
                for _ in range(a.repeats):
                    t0 = time.perf_counter()
                    await speech.transcribe(pcm, opts)
                    times.append(time.perf_counter() - t0)
                result[f"batched_{b}_s"] = round(statistics.median(times), 3)
                result[f"batched_{b}_over_mlx_whisper"] = round(result[f"batched_{b}_s"] / result["mlx_whisper_s"], 3)
            engine_.close()

    anyio.run(run)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
