"""`tandem transcribe FILE [MODEL]`: a file → text (or json, srt, vtt) on stdout, no server."""

from __future__ import annotations

import argparse
import msgspec
import sys
import time
from typing import TYPE_CHECKING, Any

from audio.formats import RESPONSE_FORMATS
from service.cli.errors import CLIError
from service.cli.parsers import add_command
from service.cli.resolve import whisper_spec

if TYPE_CHECKING:
    import numpy as np

__all__ = ["add_transcribe"]


def add_transcribe(sub: Any) -> None:
    """Register `tandem transcribe`. Raises nothing."""
    p = add_command(sub, "transcribe", "transcribe an audio file (no server)")
    p.add_argument("file", help="audio file (wav, mp3, m4a, flac, ogg, webm, ...); - reads it from stdin")
    p.add_argument("model", nargs="?", default=None,
                   help="Whisper checkpoint: mlx-whisper dir, CTranslate2 dir, cached HF repo, a name `tandem models ls` "
                        "lists, or tiny.en (default: the demo tiny.en)")
    # `tandem serve` names its Whisper `--whisper-model`: users try the same flag here.
    p.add_argument("--whisper-model", dest="model_flag", default=None, metavar="MODEL",
                   help="the Whisper checkpoint, as the positional MODEL (default: the demo tiny.en)")
    p.add_argument("--language", default=None, help="ISO-639-1 code or name (default: detected)")
    p.add_argument("--task", choices=["transcribe", "translate"], default="transcribe",
                   help="translate: into English (an English-only model transcribes, as the server's "
                        "/v1/audio/translations answers)")
    p.add_argument("--temperature", type=float, default=0.0, help="start of the fallback ladder")
    p.add_argument("--no-fallback", action="store_true", help="decode at --temperature only")
    p.add_argument("--prompt", default=None, help="initial prompt: spelling, vocabulary (default: none)")
    p.add_argument("--no-timestamps", action="store_true", help="decode without timestamp tokens")
    p.add_argument("--no-condition", action="store_true", help="do not condition on previous text")
    p.add_argument("--no-vad", dest="vad", action="store_false",
                   help="let Whisper hear silence too (default: only the speech webrtcvad finds)")
    p.add_argument("--vad", dest="vad", action="store_true", help=argparse.SUPPRESS)  # the default; kept for scripts
    p.add_argument("--vad-trim", action="store_true", help="with --no-vad, cut leading/trailing silence")
    p.add_argument("--word-timestamps", action="store_true", help="word-level timestamps (--format verbose_json)")
    p.add_argument("--format", choices=RESPONSE_FORMATS, default="text", help="output format")
    p.add_argument("--batch-size", type=int, default=1, metavar="N",
                   help="cut at silences and decode N chunks per batched call (GPU speed; no conditioning)")
    p.add_argument("--verbose", action="store_true", help="print segments as they are decoded and the speed")
    p.set_defaults(func=_transcribe)


def _transcribe(args: argparse.Namespace) -> int:
    import anyio

    from audio.errors import AudioInputError, InvalidOption, WhisperCheckpointError
    from audio.formats import render
    from audio.pcm import SAMPLE_RATE, check_file_length
    from audio.speech import SpeechService
    from audio.transcript import TranscribeOptions, Transcript
    from engine.runtime import Engine
    from service.process.cleanup import loading_models

    if not 0 <= args.temperature <= 1:
        raise CLIError("--temperature must be in 0..1")
    if args.batch_size < 1:
        raise CLIError("--batch-size must be >= 1")
    if args.model_flag is not None:
        if args.model is not None and args.model != args.model_flag:
            raise CLIError(f"two Whisper models given: {args.model!r} and --whisper-model {args.model_flag!r}")
        args.model = args.model_flag
    if args.vad_trim and args.vad:
        raise CLIError("--vad-trim works with --no-vad only (VAD, the default, already leaves silence out)")
    if args.word_timestamps and args.format != "verbose_json":  # as the server refuses it: never silently dropped
        raise CLIError(f"--word-timestamps works with --format verbose_json only, not {args.format} (the other "
                       "formats have no place for words)")
    name = "stdin" if args.file == "-" else args.file
    try:
        pcm = _read_audio(args.file)
    except OSError as exc:  # its message names the path already
        raise CLIError(str(exc)) from None
    except AudioInputError as exc:
        raise CLIError(f"{name}: {exc}") from None
    try:
        check_file_length(pcm)  # as the server refuses it: an empty answer would look like silence
    except AudioInputError as exc:
        raise CLIError(f"{name}: {exc}", code=1) from None
    engine = Engine(None)
    try:
        with loading_models():  # a first use imports the checkpoint: not a server's to remove as interrupted
            speech = SpeechService.from_spec(engine.tasks, whisper_spec(args.model), resident=True)
        options = speech.options(
            language=args.language, task=args.task, english_only_transcribes=True, prompt=args.prompt,
            temperatures=TranscribeOptions.ladder(args.temperature, fallback=not args.no_fallback),
            without_timestamps=args.no_timestamps, condition_on_previous_text=not args.no_condition,
            word_timestamps=args.word_timestamps, vad=args.vad, vad_trim=args.vad_trim, batch_size=args.batch_size)
    except (WhisperCheckpointError, InvalidOption) as exc:
        raise CLIError(str(exc)) from None
    if args.task == "translate" and not speech.multilingual:  # as the server's /v1/audio/translations answers
        print("note: this Whisper model is English-only: its translation into English is its transcription",
              file=sys.stderr)

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
        assert result is not None  # transcribe_stream always ends with the Transcript
        return result, t1 - t0, t2 - t1

    try:
        transcript, load_s, run_s = anyio.run(run)
    except WhisperCheckpointError as exc:
        raise CLIError(str(exc)) from None
    body = render(transcript, args.format, words=args.word_timestamps)
    # msgspec writes a NaN (a window whose timestamp rules masked every token) as null, as the server's answer does:
    # json.dumps wrote NaN, which no strict JSON reader takes.
    sys.stdout.write(msgspec.json.encode(body).decode() + "\n" if isinstance(body, dict) else body)
    if args.verbose:
        audio_s = len(pcm) / SAMPLE_RATE
        print(f"{audio_s:.1f} s audio in {run_s:.2f} s ({audio_s / max(run_s, 1e-9):.1f}× realtime; "
              f"model load {load_s:.2f} s)", file=sys.stderr)
    return 0


def _read_audio(path: str) -> np.ndarray:
    """The audio at `path` (a file or a pipe), or on stdin for "-", as `tandem generate` reads a prompt. Raises
    CLIError (nothing on stdin, or a terminal), OSError, AudioInputError."""
    from audio.pcm import decode_container, load_audio_file

    if path != "-":
        return load_audio_file(path)
    if sys.stdin is None:  # started with stdin closed (`<&-`): Python leaves sys.stdin None
        raise CLIError("- reads the audio from stdin, which is closed: pipe a file in (tandem transcribe - < talk.wav)")
    if sys.stdin.isatty():
        raise CLIError("- reads the audio from stdin, which is a terminal: pipe a file in "
                       "(tandem transcribe - < talk.wav)")
    data = sys.stdin.buffer.read()
    if not data:
        raise CLIError("stdin is empty: no audio arrived to transcribe")
    return decode_container(data, param="file")


def _clock(seconds: float) -> str:
    from audio.formats import timestamp

    return timestamp(seconds, always_hours=False)
