"""The speech options of `tandem serve`: --whisper-model, residency, and transcription-only servers."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from service.cli.errors import CLIError
from service.config import ServiceConfig

__all__ = ["add_serve_speech_args", "configure_serve_speech", "ServeSpeech"]


@dataclass(frozen=True)
class ServeSpeech:
    """What `serve` will do for speech: transcription only (no chat model), and the line to log once
    every check passed."""

    transcription_only: bool
    note: str


def add_serve_speech_args(p: argparse.ArgumentParser) -> None:
    """--whisper-model and the residency flags of `tandem serve`. Raises nothing."""
    g = p.add_argument_group("speech")
    g.add_argument("--whisper-model", default=None,
                   help="Whisper checkpoint: mlx-whisper dir, CTranslate2 dir, cached HF repo, or tiny.en "
                        "(default: the demo tiny.en when installed)")
    g.add_argument("--no-whisper", action="store_true", help="serve no Whisper model")
    g.add_argument("--whisper-idle-unload", type=float, default=0.0, metavar="SEC",
                   help="unload Whisper after SEC idle seconds (0: after every request)")
    g.add_argument("--whisper-resident", action="store_true", help="keep Whisper loaded")
    g.add_argument("--preload", action="store_true", help="load Whisper at startup")
    g.add_argument("--session-ttl", type=float, default=300.0, metavar="SEC",
                   help="drop live sessions idle this long")


def configure_serve_speech(args: argparse.Namespace, config: ServiceConfig) -> ServeSpeech:
    """Resolve speech for `serve` before any worker starts; store it in config.extra. Transcription only
    when the positional model is a Whisper checkpoint. Raises CLIError for a --whisper-model that is not
    a Whisper checkpoint or bad numbers."""
    from audio.errors import WhisperCheckpointError
    from audio.whisper import DEMO_MODEL, resolve_whisper_checkpoint
    from service.speech.setup import SpeechConfig

    if args.whisper_idle_unload < 0 or args.session_ttl <= 0:
        raise CLIError("--whisper-idle-unload must be >= 0 and --session-ttl > 0")
    only = False
    spec = args.whisper_model
    if args.model is not None and spec is None:
        try:
            resolve_whisper_checkpoint(args.model)
            spec, only = args.model, True
        except WhisperCheckpointError:
            pass  # a chat model
    if args.no_whisper and not only:
        return ServeSpeech(False, "speech off (--no-whisper)")
    try:
        path = resolve_whisper_checkpoint(spec)
    except WhisperCheckpointError as exc:
        if spec is None:  # demo default absent: serve chat only
            return ServeSpeech(False, f"speech off ({exc})")
        raise CLIError(f"--whisper-model: {exc}") from None
    SpeechConfig(model=spec, idle_unload_sec=args.whisper_idle_unload, resident=args.whisper_resident,
                 preload=args.preload, session_ttl_sec=args.session_ttl, transcription_only=only).store(config)
    if only:
        config.model = None
    return ServeSpeech(only, f"whisper {spec or DEMO_MODEL} ({path}){' — transcription only' if only else ''}")
