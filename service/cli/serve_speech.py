"""The speech options of `tandem serve`: --whisper-model, residency, and transcription-only servers."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from service.cli.errors import CLIError
from service.cli.parsers import finite, seconds
from service.config import ServiceConfig

__all__ = ["add_serve_speech_args", "configure_serve_speech", "ServeSpeech", "mark_speech_only", "speech_flags_given"]

# Where the parser keeps (flag, dest, default) of every flag that only changes speech (a set_defaults entry, so
# the parsed arguments carry it to configure_serve_speech).
_SPEECH_ONLY = "speech_only_flags"


@dataclass(frozen=True)
class ServeSpeech:
    """What `serve` will do for speech: transcription only (no chat model), and the line to log once
    every check passed."""

    transcription_only: bool
    note: str


def add_serve_speech_args(p: argparse.ArgumentParser) -> None:
    """--whisper-model and the residency flags of `tandem serve`. Raises nothing."""
    g = p.add_argument_group("speech")
    speech_only: list[argparse.Action] = []

    def add(*names: str, **kwargs: Any) -> None:  # every flag here but --no-whisper changes speech only
        speech_only.append(g.add_argument(*names, **kwargs))

    add("--whisper-model", default=None,
        help="Whisper checkpoint: mlx-whisper dir, CTranslate2 dir, cached HF repo, or tiny.en "
             "(default: the demo tiny.en when installed)")
    g.add_argument("--no-whisper", action="store_true",
                   help="serve no Whisper model (a speech-only flag given beside it is refused)")
    add("--whisper-idle-unload", type=seconds, default=0.0, metavar="SEC",
        help="unload Whisper after SEC idle seconds (0: after every request)")
    add("--whisper-resident", action="store_true", help="keep Whisper loaded")
    add("--preload", action="store_true", help="load Whisper at startup")
    add("--session-ttl", type=seconds, default=300.0, metavar="SEC",
        help="drop live sessions whose client sent nothing this long while none of their audio was "
             "being transcribed; websockets included (an error event, then a normal close)")
    add("--no-vad", action="store_true",
        help="requests that do not say get no VAD: Whisper hears silence too (default: only speech)")
    add("--max-sessions", type=int, default=64, help="live sessions open at once (more get 429)")
    add("--key-session-share", type=finite, default=0.5, metavar="F",
        help="with two or more --api-key keys, one key may hold at most this share of --max-sessions "
             "(more get 429 session_share_reached while other keys still get in; 1: no cap)")
    add("--max-session-seconds", type=seconds, default=3600.0, metavar="SEC",
        help="audio one live session may receive")
    add("--max-buffered-audio", type=seconds, default=1800.0, metavar="SEC",
        help="untranscribed audio all live sessions may hold together (more is refused: 429)")
    add("--max-session-lag", type=seconds, default=120.0, metavar="SEC",
        help="untranscribed audio one live session may hold (a faster sender is refused: 429)")
    add("--whisper-step-positions", type=int, default=375, metavar="N",
        help="encoder positions a Whisper unit covers when chat is idle (a 30 s window is 1500)")
    add("--whisper-step-tokens", type=int, default=4, metavar="N",
        help="tokens each Whisper row decodes per step when chat is idle")
    add("--whisper-chat-share", type=finite, default=0.3, metavar="F",
        help="while chat decodes, a Whisper step lasts at most this share of a chat iteration")
    add("--whisper-catch-up", type=seconds, default=1.0, metavar="SEC",
        help="while chat decodes, a Whisper step's share doubles for each SEC the oldest live "
             "session's window has waited (up to 8x), so live speech that falls behind catches up")
    add("--live-context", choices=("auto", "fit", "whole"), default="auto",
        help="what a live decode encodes: whole, Whisper's 30 s window, as mlx-whisper; fit, the open audio "
             "plus 1 s, at least 10 s (a third of the encoder's work; a final that fails the thresholds or "
             "loops is redone whole); auto (default): fit on a CPU, whole on a GPU")
    add("--whisper-min-step-ms", type=finite, default=None, metavar="MS",
        help="when chat is idle, a Whisper step goes on until it took this long (default: 5 on a "
             "GPU, where one unit is shorter than a trip through the loop; 0 on a CPU)")
    mark_speech_only(p, *speech_only)


def mark_speech_only(p: argparse.ArgumentParser, *actions: argparse.Action) -> None:
    """Record `actions` as flags that only change speech: given beside --no-whisper, configure_serve_speech refuses
    them (they would be dropped unseen). Raises nothing."""
    known: list[tuple[str, str, object]] = list(p.get_default(_SPEECH_ONLY) or [])
    p.set_defaults(**{_SPEECH_ONLY: known + [(a.option_strings[-1], a.dest, a.default) for a in actions]})


def speech_flags_given(args: argparse.Namespace) -> list[str]:
    """The speech-only flags whose value differs from their default (given with another value), sorted. Raises
    nothing."""
    flags: list[tuple[str, str, object]] = getattr(args, _SPEECH_ONLY, [])
    return sorted(flag for flag, dest, default in flags if getattr(args, dest) != default)


def configure_serve_speech(args: argparse.Namespace, config: ServiceConfig) -> ServeSpeech:
    """Resolve speech for `serve` before any worker starts; store it in config.extra. Transcription only
    when the positional model is a Whisper checkpoint. Raises CLIError for a --whisper-model that is not
    a Whisper checkpoint or bad numbers, and (exit 1) for a Whisper checkpoint with a file this user cannot read."""
    from audio.errors import WhisperCheckpointError, WhisperUnreadableError
    from audio.whisper import DEMO_MODEL, resolve_whisper_checkpoint
    from service.cli.resolve import whisper_spec
    from service.speech.setup import SpeechConfig

    if args.whisper_idle_unload < 0 or args.session_ttl <= 0:
        raise CLIError("--whisper-idle-unload must be >= 0 and --session-ttl > 0")
    if args.max_sessions < 1 or args.whisper_step_positions < 1 or args.whisper_step_tokens < 1:
        raise CLIError("--max-sessions, --whisper-step-positions and --whisper-step-tokens must be >= 1")
    if args.whisper_min_step_ms is not None and not 0 <= args.whisper_min_step_ms <= 1000:
        raise CLIError("--whisper-min-step-ms must be in [0, 1000]")
    if min(args.max_session_seconds, args.max_buffered_audio, args.max_session_lag) <= 0:
        raise CLIError("--max-session-seconds, --max-buffered-audio and --max-session-lag must be > 0")
    if not 0 < args.key_session_share <= 1:
        raise CLIError("--key-session-share must be in (0, 1]")
    if not 0 < args.whisper_chat_share <= 10:
        raise CLIError("--whisper-chat-share must be in (0, 10]")
    if not args.whisper_catch_up > 0:
        raise CLIError("--whisper-catch-up must be > 0")
    # Flags that would be dropped without a word: speech off with speech settings, a resident model told to unload.
    if args.no_whisper and (given := speech_flags_given(args)):
        raise CLIError(f"--no-whisper serves no Whisper model: {', '.join(given)} cannot apply")
    if args.whisper_resident and args.whisper_idle_unload > 0:
        raise CLIError("--whisper-resident keeps Whisper loaded: --whisper-idle-unload cannot apply")
    only = False
    spec = whisper_spec(args.whisper_model)
    # "demo" names both demos; as the model to serve it is the chat one (it served Whisper alone: chat 404).
    if args.model is not None and spec is None and args.model != "demo":
        try:
            resolve_whisper_checkpoint(args.model)
            spec, only = args.model, True
        except WhisperUnreadableError as exc:
            raise CLIError(f"could not load model {args.model}: {exc}", code=1) from None
        except WhisperCheckpointError:
            pass  # a chat model
    if args.no_whisper and only:
        raise CLIError(f"--no-whisper: {args.model} is a Whisper model, and with speech off nothing would be served")
    if args.no_whisper:
        return ServeSpeech(False, "speech off (--no-whisper)")
    try:
        path = resolve_whisper_checkpoint(spec)
    except WhisperUnreadableError as exc:
        # Served, it answered /health ok and every transcription 500: one line and exit 1, as a chat model's.
        raise CLIError(f"could not load Whisper model {spec or DEMO_MODEL}: {exc}", code=1) from None
    except WhisperCheckpointError as exc:
        if spec is None:  # demo default absent: serve chat only
            return ServeSpeech(False, f"speech off ({exc})")
        raise CLIError(f"--whisper-model: {exc}") from None
    SpeechConfig(model=spec, idle_unload_sec=args.whisper_idle_unload, resident=args.whisper_resident,
                 preload=args.preload, session_ttl_sec=args.session_ttl, transcription_only=only,
                 vad=not args.no_vad, max_sessions=args.max_sessions, key_session_share=args.key_session_share,
                 max_session_sec=args.max_session_seconds,
                 max_buffered_sec=args.max_buffered_audio, max_lag_sec=args.max_session_lag,
                 step_positions=args.whisper_step_positions, step_tokens=args.whisper_step_tokens,
                 chat_share=args.whisper_chat_share, catch_up_sec=args.whisper_catch_up,
                 min_step_ms=args.whisper_min_step_ms, live_context=args.live_context).store(config)
    if only:
        config.model = None
    return ServeSpeech(only, f"whisper {spec or DEMO_MODEL} ({path}){' — transcription only' if only else ''}")
