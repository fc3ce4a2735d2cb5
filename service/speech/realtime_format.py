"""A Realtime session's input audio format as each dialect writes it, read and shown so that what a session object
shows is taken back unchanged (a client that echoes its `session.updated` changes nothing).

GA: `audio.input.format`, `{"type": "audio/pcm", "rate": 24000}`, `{"type": "audio/pcmu"}` / `audio/pcma` (G.711,
8 kHz), and our extension, audio/pcm's `encoding` (s16le, f32le, s16be, ulaw, alaw: what /v1/audio/live's `?encoding=`
takes).
Beta: `input_audio_format`, a string: OpenAI's `pcm16` (s16le at 24 kHz), `g711_ulaw`, `g711_alaw` (8 kHz); any other
format (another rate or encoding, set by /v1/audio/live's query or a GA update) is shown, and taken, as the GA format
in content-type form, `audio/pcm;rate=16000;encoding=s16le` (beta has no rate field: `pcm16` would say 24 kHz).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from audio.errors import AudioInputError
from audio.pcm import G711_RATE, MAX_RATE, MIN_RATE
from audio.pcm_parameters import split_content_type, whole_number
from service.speech.config_error import ConfigError, known_fields

__all__ = ["InputEncoding", "DEFAULT_RATE", "BETA_NAMES", "ga_format", "beta_format", "shown_ga", "shown_beta"]

InputEncoding = Literal["s16le", "f32le", "s16be", "ulaw", "alaw"]
DEFAULT_RATE = 24000  # what OpenAI clients send
# each input encoding by its beta name and its GA format type (G.711's rate is fixed: 8 kHz)
_BETA_FORMATS: dict[str, tuple[InputEncoding, int]] = {"pcm16": ("s16le", DEFAULT_RATE),
                                                       "g711_ulaw": ("ulaw", G711_RATE),
                                                       "g711_alaw": ("alaw", G711_RATE)}
BETA_NAMES = tuple(_BETA_FORMATS)
_GA_FORMATS: dict[str, InputEncoding] = {"audio/pcm": "s16le", "audio/pcmu": "ulaw", "audio/pcma": "alaw"}
# `encoding` in a GA format, our extension: what /v1/audio/live's `?encoding=` takes, as its session.created shows it
_PCM_ENCODINGS: tuple[InputEncoding, ...] = get_args(InputEncoding)


def ga_format(f: Any, where: str) -> tuple[InputEncoding, int]:
    """A GA format object's encoding and rate. Raises ConfigError naming the field under `where`."""
    if not isinstance(f, dict):
        raise ConfigError("`format` must be an object", where)
    known_fields(f, {"type", "rate", "encoding"}, where)
    kind = f.get("type", "audio/pcm")
    encoding = _GA_FORMATS.get(kind) if isinstance(kind, str) else None
    if encoding is None:
        raise ConfigError(f"audio format {kind!r} is not supported; use {', '.join(_GA_FORMATS)}", f"{where}.type")
    if f.get("encoding") is not None:  # audio/pcm's samples in another encoding; G.711's types name their own
        named = f["encoding"]
        allowed = _PCM_ENCODINGS if kind == "audio/pcm" else (encoding,)
        if named not in allowed:
            raise ConfigError(f"encoding must be {' or '.join(allowed)} for {kind}", f"{where}.encoding")
        encoding = named
    rate = f.get("rate", G711_RATE if encoding in ("ulaw", "alaw") else DEFAULT_RATE)
    if kind != "audio/pcm" and rate != G711_RATE:  # a rate beside G.711's types is only ever their own
        raise ConfigError(f"{kind} is {G711_RATE} Hz", f"{where}.rate")
    if not isinstance(rate, int) or isinstance(rate, bool) or not MIN_RATE <= rate <= MAX_RATE:
        raise ConfigError(f"rate must be an integer in {MIN_RATE}–{MAX_RATE} Hz", f"{where}.rate")
    return encoding, rate


def beta_format(value: Any, where: str) -> tuple[InputEncoding, int]:
    """A beta `input_audio_format`'s encoding and rate: one of beta's names, or a GA format as a content type
    (`audio/pcm;rate=16000;encoding=f32le`, what shown_beta writes). Raises ConfigError naming `where`."""
    if isinstance(value, str) and value in _BETA_FORMATS:
        return _BETA_FORMATS[value]
    if not (isinstance(value, str) and value.lower().startswith("audio/")):
        raise ConfigError(f"input_audio_format {value!r} is not supported; use {', '.join(_BETA_FORMATS)} (or a "
                          "format as `audio/pcm;rate=16000;encoding=s16le`)", where)
    try:  # read as the HTTP routes read a Content-Type (audio/pcm.py): a trailing `;`, quotes, no repeats
        kind, params = split_content_type(value)
        fields: dict[str, Any] = {"type": kind, **params}
        if "rate" in params and (rate := whole_number(params["rate"])) is not None:  # else ga_format refuses it
            fields["rate"] = rate
        return ga_format(fields, where)
    except (ConfigError, AudioInputError) as exc:  # the string is one field: named whole, the message says which part
        code = exc.code if isinstance(exc, ConfigError) else "invalid_value"
        raise ConfigError(f"input_audio_format {value[:80]!r}: {exc.message}", where, code) from None


def shown_ga(encoding: InputEncoding, rate: int) -> dict[str, Any]:
    """The GA format object, as OpenAI's: only audio/pcm carries a rate (G.711's is fixed); another encoding of it
    is named. Raises nothing."""
    if encoding in ("ulaw", "alaw") and rate == G711_RATE:
        return {"type": "audio/pcmu" if encoding == "ulaw" else "audio/pcma"}
    shown: dict[str, Any] = {"type": "audio/pcm", "rate": rate}
    return shown if encoding == "s16le" else {**shown, "encoding": encoding}


def shown_beta(encoding: InputEncoding, rate: int) -> str:
    """The beta `input_audio_format`: beta's name for the format, else the format as a content type (both taken back
    by beta_format). Raises nothing."""
    named = next((name for name, fmt in _BETA_FORMATS.items() if fmt == (encoding, rate)), None)
    return named if named is not None else f"audio/pcm;rate={rate};encoding={encoding}"
