"""Speech on the command line: `tandem transcribe`, `tandem dictate`, `tandem models import`, and the
speech options of `tandem serve` (--whisper-model, residency, transcription-only servers)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["add_transcribe", "add_dictate", "add_models_import", "add_serve_speech_args", "configure_serve_speech"]


def _cli_error(message: str, code: int = 2) -> Exception:
    from service.cli import CLIError

    return CLIError(message, code)


# ---------------------------------------------------------------- serve options


def add_serve_speech_args(p: argparse.ArgumentParser) -> None:
    """--whisper-model and the residency flags of `tandem serve`. Raises nothing."""
    g = p.add_argument_group("speech")
    g.add_argument("--whisper-model", default=None,
                   help="Whisper checkpoint: mlx-whisper dir, CTranslate2 dir, cached HF repo, or tiny.en "
                        "(default: the demo tiny.en when installed)")
    g.add_argument("--no-whisper", action="store_true", help="serve no Whisper model")
    g.add_argument("--whisper-idle-unload", type=float, default=0.0, metavar="SEC",
                   help="unload Whisper after SEC idle seconds (default 0: after every request)")
    g.add_argument("--whisper-resident", action="store_true", help="keep Whisper loaded")
    g.add_argument("--preload", action="store_true", help="load Whisper at startup")
    g.add_argument("--session-ttl", type=float, default=300.0, metavar="SEC",
                   help="drop live sessions idle this long (default 300)")


def configure_serve_speech(args: argparse.Namespace, config: Any) -> bool:
    """Resolve speech for `serve` before any worker starts; store it in config.extra. Returns True for a
    transcription-only server (the positional model is a Whisper checkpoint). Raises CLIError for a
    --whisper-model that is not a Whisper checkpoint or bad numbers."""
    from audio.whisper import WhisperCheckpointError, resolve_whisper_checkpoint
    from service.speech_setup import SpeechConfig

    if args.whisper_idle_unload < 0 or args.session_ttl <= 0:
        raise _cli_error("--whisper-idle-unload must be >= 0 and --session-ttl > 0")
    only = False
    spec = args.whisper_model
    if args.model is not None and spec is None:
        try:
            resolve_whisper_checkpoint(args.model)
            spec, only = args.model, True
        except WhisperCheckpointError:
            pass  # a chat model
    if args.no_whisper and not only:
        return False
    try:
        path = resolve_whisper_checkpoint(spec)
    except WhisperCheckpointError as exc:
        if spec is None:  # demo default absent: serve chat only
            print(f"tandem: speech off ({exc})", file=sys.stderr)
            return False
        raise _cli_error(f"--whisper-model: {exc}") from None
    SpeechConfig(model=spec, idle_unload_sec=args.whisper_idle_unload, resident=args.whisper_resident,
                 preload=args.preload, session_ttl_sec=args.session_ttl, transcription_only=only).store(config)
    if only:
        config.model = None
    print(f"tandem: whisper {spec or 'tiny.en'} ({path}){' — transcription only' if only else ''}",
          file=sys.stderr, flush=True)
    return only


# ---------------------------------------------------------------- transcribe


def add_transcribe(sub: Any) -> None:
    """`tandem transcribe FILE [MODEL]`. Raises nothing."""
    p = sub.add_parser("transcribe", help="transcribe an audio file (no server)")
    p.add_argument("file")
    p.add_argument("model", nargs="?", default=None, help="Whisper checkpoint (default: demo tiny.en)")
    p.add_argument("--language", default=None)
    p.add_argument("--task", choices=["transcribe", "translate"], default="transcribe")
    p.add_argument("--temperature", type=float, default=0.0, help="start of the fallback ladder")
    p.add_argument("--no-fallback", action="store_true", help="decode at --temperature only")
    p.add_argument("--prompt", default=None, help="initial prompt (spelling, vocabulary)")
    p.add_argument("--no-timestamps", action="store_true", help="decode without timestamp tokens")
    p.add_argument("--no-condition", action="store_true", help="do not condition on previous text")
    p.add_argument("--vad", action="store_true", help="skip windows without speech")
    p.add_argument("--vad-trim", action="store_true", help="cut leading/trailing silence")
    p.add_argument("--word-timestamps", action="store_true")
    p.add_argument("--format", choices=["text", "json", "verbose_json", "srt", "vtt"], default="text")
    p.add_argument("--batch-size", type=int, default=1, metavar="N",
                   help="cut at silences and decode N chunks per batched call (GPU speed; no conditioning)")
    p.add_argument("--verbose", action="store_true", help="print segments as they are decoded and the speed")
    p.set_defaults(func=_transcribe)


def _transcribe(args: argparse.Namespace) -> int:
    import json

    import anyio

    from audio.formats import render
    from audio.pcm import AudioInputError, load_audio_file
    from audio.speech import SpeechService
    from audio.transcript import TranscribeOptions, Transcript
    from audio.whisper import WhisperCheckpointError
    from engine.runtime import Engine

    if not 0 <= args.temperature <= 1:
        raise _cli_error("--temperature must be in 0..1")
    if args.batch_size < 1:
        raise _cli_error("--batch-size must be >= 1")
    try:
        pcm = load_audio_file(args.file)
    except (FileNotFoundError, AudioInputError) as exc:
        raise _cli_error(str(exc)) from None
    engine = Engine(None)
    try:
        speech = SpeechService.from_spec(engine.tasks, args.model, resident=True)
        options = speech.options(
            language=args.language, task=args.task, prompt=args.prompt,
            temperatures=TranscribeOptions.ladder(args.temperature, fallback=not args.no_fallback),
            without_timestamps=args.no_timestamps, condition_on_previous_text=not args.no_condition,
            word_timestamps=args.word_timestamps, vad=args.vad, vad_trim=args.vad_trim, batch_size=args.batch_size)
    except (WhisperCheckpointError, ValueError) as exc:
        raise _cli_error(str(exc)) from None

    async def run() -> tuple[Transcript, float, float]:
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.serve)
            t0 = time.perf_counter()
            await speech.residency.preload()
            t1 = time.perf_counter()
            result: Transcript | None = None
            async for item in speech.transcribe_stream(pcm, options):
                if isinstance(item, Transcript):
                    result = item
                elif args.verbose:
                    for s in item:
                        print(f"[{_clock(s.start)} --> {_clock(s.end)}] {s.text.strip()}", file=sys.stderr, flush=True)
            t2 = time.perf_counter()
            engine.close()
        assert result is not None
        return result, t1 - t0, t2 - t1

    try:
        transcript, load_s, run_s = anyio.run(run)
    except WhisperCheckpointError as exc:
        raise _cli_error(str(exc)) from None
    body = render(transcript, args.format, words=args.word_timestamps)
    sys.stdout.write(json.dumps(body, ensure_ascii=False) + "\n" if isinstance(body, dict) else body)
    if args.verbose:
        audio_s = len(pcm) / 16000
        print(f"{audio_s:.1f} s audio in {run_s:.2f} s ({audio_s / max(run_s, 1e-9):.1f}× realtime; "
              f"model load {load_s:.2f} s)", file=sys.stderr)
    return 0


def _clock(seconds: float) -> str:
    from audio.formats import timestamp

    return timestamp(seconds, always_hours=False)


# ---------------------------------------------------------------- dictate


def add_dictate(sub: Any) -> None:
    """`tandem dictate FILE`: stream a file to a running server's session like a microphone would."""
    p = sub.add_parser("dictate", help="stream an audio file to a running server's live session (250 ms chunks)")
    p.add_argument("file")
    p.add_argument("--url", default="http://127.0.0.1:8080", help="server base URL")
    p.add_argument("--model", default=None)
    p.add_argument("--language", default=None)
    p.add_argument("--chunk-ms", type=int, default=250)
    p.add_argument("--realtime", action="store_true", help="pace chunks at speaking speed")
    p.add_argument("--s16", action="store_true", help="send 16-bit PCM instead of float32")
    p.set_defaults(func=_dictate)


def _dictate(args: argparse.Namespace) -> int:
    import httpx
    import numpy as np

    from audio.pcm import AudioInputError, load_audio_file

    try:
        pcm = load_audio_file(args.file)
    except (FileNotFoundError, AudioInputError) as exc:
        raise _cli_error(str(exc)) from None
    if args.chunk_ms < 10:
        raise _cli_error("--chunk-ms must be >= 10")
    base = args.url.rstrip("/")
    step = 16000 * args.chunk_ms // 1000
    if args.s16:
        ctype, payload = "audio/pcm;rate=16000;encoding=s16le", (np.clip(pcm, -1, 1) * 32767).astype("<i2")
    else:
        ctype, payload = "audio/pcm;rate=16000", pcm.astype("<f4")
    try:
        with httpx.Client(timeout=600) as http:
            r = http.post(f"{base}/v1/audio/sessions", json={k: v for k, v in
                                                            (("model", args.model), ("language", args.language)) if v})
            _raise_for(r)
            sid = r.json()["id"]
            start = time.perf_counter()
            for i in range(0, len(payload), step):
                r = http.post(f"{base}/v1/audio/sessions/{sid}/audio", content=payload[i:i + step].tobytes(),
                              headers={"content-type": ctype})
                _raise_for(r)
                if args.realtime:  # a microphone delivers audio no faster than it is spoken
                    time.sleep(max(0.0, start + (i + step) / 16000 - time.perf_counter()))
            t0 = time.perf_counter()
            r = http.post(f"{base}/v1/audio/sessions/{sid}/finish")
            _raise_for(r)
            latency = time.perf_counter() - t0
            http.delete(f"{base}/v1/audio/sessions/{sid}")
    except httpx.HTTPError as exc:
        raise _cli_error(f"cannot reach {base}: {exc}", code=1) from None
    print(r.json()["text"].strip())
    print(f"{len(pcm) / 16000:.1f} s audio, {r.json().get('duration', 0):.1f} s decoded; finish took {latency:.2f} s",
          file=sys.stderr)
    return 0


def _raise_for(r: Any) -> None:
    if r.status_code >= 400:
        try:
            message = r.json()["error"]["message"]
        except Exception:
            message = r.text[:200]
        raise _cli_error(f"server said {r.status_code}: {message}", code=1)


# ---------------------------------------------------------------- models import


def add_models_import(msub: Any) -> None:
    """`tandem models import CT2_DIR OUT_DIR`. Raises nothing."""
    p = msub.add_parser("import", help="convert a faster-whisper (CTranslate2) Whisper dir into mlx-whisper's layout")
    p.add_argument("source", help="dir with model.bin (CTranslate2)")
    p.add_argument("output", help="new mlx-whisper dir (config.json + weights.safetensors)")
    p.add_argument("--dtype", choices=["float32", "float16"], default="float32",
                   help="stored weight type (float32 suits the CPU backend)")
    p.set_defaults(func=_models_import)


def _models_import(args: argparse.Namespace) -> int:
    from audio.ctranslate2_import import CheckpointFormatError, import_ct2_whisper

    try:
        out = import_ct2_whisper(Path(args.source), Path(args.output), dtype=args.dtype)
    except (CheckpointFormatError, FileNotFoundError) as exc:
        raise _cli_error(str(exc)) from None
    print(out)
    return 0
