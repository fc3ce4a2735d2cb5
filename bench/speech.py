"""Speech benchmark: `tandem transcribe`'s path vs `mlx_whisper.transcribe` on the same file and model in one
run, and a live session's finish latency after the last chunk vs one window's decode time.

    uv run python -m bench.speech [--model tiny.en] [--samples DIR] [--gap 6] [--pace 1.0] [--no-vad]
    uv run python -m bench.speech --audio FILE.wav --reference FILE.txt --no-vad   # any file, as mlx_whisper hears it

The test file is the shared speech clips joined with `--gap` seconds of silence (~73 s, three windows), or `--audio`
with its reference text. `--no-vad`: tandem hears the whole signal, as mlx_whisper does (by default only the speech).
mlx_whisper.transcribe gets the converted MLX dir of the same checkpoint (fp16=False on CPU). The session
is fed 250 ms float32 chunks, paced at `--pace`× real time (0 = as fast as possible), as a microphone would.
Prints one JSON document.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from engine.backend import ensure_fast_blas

ensure_fast_blas()  # a script entry point: the fast BLAS must be loaded before mlx is imported below

import anyio
import numpy as np

from audio.pcm import SAMPLE_RATE

__all__ = ["main"]

SR = SAMPLE_RATE


def _joined(samples: Path, gap_s: float) -> tuple[np.ndarray, str]:
    from audio.pcm import load_audio_file

    wavs = sorted(samples.glob("*.wav"))
    if not wavs:
        raise SystemExit(f"no .wav files in {samples}")
    gap = np.zeros(int(gap_s * SR), np.float32)
    pcm = np.concatenate([np.concatenate([load_audio_file(w), gap]) for w in wavs])
    return pcm, " ".join(w.with_suffix(".txt").read_text().strip() for w in wavs)


def _file_rounds(engine: Any, speech: Any, path: Path, pcm: np.ndarray, options: Any, fp16: bool,
                 repeats: int, batch_size: int) -> dict[str, Any]:
    """Alternate tandem's path (windows as tasks on the engine loop) and mlx_whisper.transcribe (blocking,
    on this thread while the loop idles), swapping who goes first each round: the machine is shared."""
    import mlx_whisper

    def reference() -> tuple[float, str]:
        t0 = time.perf_counter()
        out = mlx_whisper.transcribe(pcm, path_or_hf_repo=str(path), fp16=fp16, language="en")
        return time.perf_counter() - t0, out["text"]

    async def run() -> dict[str, Any]:
        ours: list[float] = []
        theirs: list[float] = []
        batched: list[float] = []
        texts: dict[str, str] = {}
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.serve)
            await speech.residency.preload()
            await speech.transcribe(pcm[: SR * 2], options)  # warm-up: first-call costs stay out
            mlx_whisper.transcribe(pcm[: SR * 2], path_or_hf_repo=str(path), fp16=fp16, language="en")
            for r in range(repeats):
                for who in (("ours", "theirs") if r % 2 == 0 else ("theirs", "ours")):
                    if who == "ours":
                        t0 = time.perf_counter()
                        t = await speech.transcribe(pcm, options)
                        ours.append(time.perf_counter() - t0)
                        texts["ours"] = t.text
                    else:
                        seconds, texts["theirs"] = reference()
                        theirs.append(seconds)
                    print(f"round {r} {who}: {(ours if who == 'ours' else theirs)[-1]:.2f} s", file=sys.stderr)
            batched_options = dataclasses.replace(options, batch_size=batch_size)
            for _ in range(repeats):
                t0 = time.perf_counter()
                t = await speech.transcribe(pcm, batched_options)
                batched.append(time.perf_counter() - t0)
                texts["batched"] = t.text
                print(f"batched[{batch_size}]: {batched[-1]:.2f} s", file=sys.stderr)
            tg.cancel_scope.cancel()
        return {"ours": ours, "theirs": theirs, "batched": batched, "texts": texts}

    return anyio.run(run)


def _session(engine: Any, speech: Any, pcm: np.ndarray, options: Any, pace: float) -> dict[str, float]:
    from audio.decoding import N_FRAMES, N_SAMPLES, WindowedTranscription
    from audio.pcm import PcmFormat

    chunk = SR // 4

    async def run() -> dict[str, float]:
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.serve)
            await tg.start(speech.run)
            loaded = await speech.residency.preload()
            # one full window's encode + decode, alone on the loop, for scale
            tr = await WindowedTranscription.start(loaded, options)
            t0 = time.perf_counter()
            await speech.scheduler.decode(loaded, tr.request(pcm[:N_SAMPLES], N_FRAMES))
            window_s = time.perf_counter() - t0
            session = speech.create_session(options)
            start = time.perf_counter()
            for i in range(0, len(pcm), chunk):
                session.append(pcm[i:i + chunk].astype("<f4").tobytes(), PcmFormat())
                if pace > 0:  # a microphone delivers audio no faster than it is spoken
                    await anyio.sleep(max(0.0, start + (i + chunk) / SR / pace - time.perf_counter()))
                else:
                    await anyio.sleep(0)
            windows_before = session.windows_done
            t1 = time.perf_counter()
            result = await session.finish()
            finish_s = time.perf_counter() - t1
            tg.cancel_scope.cancel()
        return {"window_decode_s": round(window_s, 3), "finish_latency_s": round(finish_s, 3),
                "finish_over_window": round(finish_s / window_s, 2), "windows_done_before_finish": windows_before,
                "windows_total": session.windows_done, "audio_s": round(len(pcm) / SR, 2),
                "text_chars": len(result.text)}

    return anyio.run(run)


def main(argv: list[str] | None = None) -> int:
    """Run the speech benchmark and print JSON. Raises SystemExit for missing samples or model."""
    p = argparse.ArgumentParser(prog="tandem benchmark speech", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="Whisper checkpoint (default: demo tiny.en)")
    p.add_argument("--samples", default=os.environ.get("TANDEM_AUDIO_SAMPLES", "../shared/audio"))
    p.add_argument("--gap", type=float, default=6.0, help="seconds of silence between clips")
    p.add_argument("--pace", type=float, default=1.0, help="session feed speed × real time (0: no pacing)")
    p.add_argument("--repeats", type=int, default=3, help="alternating rounds per implementation (median reported)")
    p.add_argument("--batch-size", type=int, default=8, help="chunks per batched call for the batched row")
    p.add_argument("--audio", type=Path, default=None, help="an audio file instead of the joined clips")
    p.add_argument("--reference", type=Path, default=None, metavar="FILE",
                   help="a file holding the reference text of --audio (required with it)")
    p.add_argument("--no-vad", action="store_true", help="tandem hears the whole signal, as mlx_whisper does")
    args = p.parse_args(argv)
    if (args.audio is None) != (args.reference is None):
        p.error("--audio and --reference go together")

    from audio.speech import SpeechService
    from audio.whisper import default_dtype, resolve_whisper_checkpoint
    from engine.backend import blas_info
    from engine.runtime import Engine
    from bench.wer import wer

    if args.audio is not None:
        from audio.pcm import load_audio_file

        if not args.reference.is_file():  # a traceback before: the text itself was given
            p.error(f"--reference names a file holding the reference text; {str(args.reference)[:60]!r} is not one")
        pcm, reference = load_audio_file(args.audio), args.reference.read_text().strip()
    else:
        pcm, reference = _joined(Path(args.samples), args.gap)
    dtype = default_dtype()
    path = resolve_whisper_checkpoint(args.model, dtype)
    audio_s = len(pcm) / SR
    print(f"audio {audio_s:.1f} s, model {path} ({dtype})", file=sys.stderr)

    engine = Engine(None)
    speech = SpeechService(engine.tasks, path, dtype=dtype, resident=True)
    options = speech.options(language="en", vad=not args.no_vad)
    rounds = _file_rounds(engine, speech, path, pcm, options, dtype == "float16", args.repeats, args.batch_size)
    tandem_s, ref_s = statistics.median(rounds["ours"]), statistics.median(rounds["theirs"])
    tandem_text, ref_text = rounds["texts"]["ours"], rounds["texts"]["theirs"]

    engine2 = Engine(None)
    speech2 = SpeechService(engine2.tasks, path, dtype=dtype, resident=True)
    session = _session(engine2, speech2, pcm, speech2.options(language="en", vad=not args.no_vad), args.pace)

    print(json.dumps({
        "machine": {"blas": blas_info().describe(), "dtype": dtype, "cpu_count": os.cpu_count()},
        "audio_s": round(audio_s, 2), "audio": str(args.audio or "joined clips"), "vad": not args.no_vad,
        "file": {
            "tandem_s": round(tandem_s, 3), "tandem_rtf": round(tandem_s / audio_s, 3),
            "mlx_whisper_s": round(ref_s, 3), "mlx_whisper_rtf": round(ref_s / audio_s, 3),
            "tandem_over_mlx_whisper": round(tandem_s / ref_s, 3),
            "wer_tandem": round(wer([reference], [tandem_text]), 4),
            "wer_mlx_whisper": round(wer([reference], [ref_text]), 4),
            "same_text": tandem_text.strip() == ref_text.strip(),
            "batched_s": round(statistics.median(rounds["batched"]), 3),
            "batched_over_mlx_whisper": round(statistics.median(rounds["batched"]) / ref_s, 3),
            "wer_batched": round(wer([reference], [rounds["texts"]["batched"]]), 4),
            "rounds_tandem_s": [round(x, 3) for x in rounds["ours"]],
            "rounds_mlx_whisper_s": [round(x, 3) for x in rounds["theirs"]],
        },
        "session": session,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
