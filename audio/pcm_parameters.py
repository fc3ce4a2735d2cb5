"""A raw-PCM content type's parameters (`audio/pcm;rate=16000;encoding=s16le`), read one way wherever one is taken:
the HTTP routes' Content-Type (audio/pcm.py) and a beta Realtime session's `input_audio_format`
(service/speech/realtime_format.py), which refused a trailing `;` and a quoted rate that the other took."""

from __future__ import annotations

from audio.errors import AudioInputError

__all__ = ["split_content_type", "whole_number"]


def split_content_type(value: str) -> tuple[str, dict[str, str]]:
    """The media type and its parameters by name, all in lower case, a value's quotes dropped (RFC 9110's
    quoted-string) and an empty parameter (a trailing `;`) skipped. Raises AudioInputError naming a parameter given
    twice (which of the two its sender meant, only it knows)."""
    mime, *params = value.split(";")
    values: dict[str, str] = {}
    for part in params:
        key, _, text = part.partition("=")
        key = key.strip().lower()
        if not key:
            continue
        if key in values:
            raise AudioInputError(f"content-type parameter {key[:60]!r} is given twice", param=key[:60],
                                  code="invalid_content_type")
        values[key] = text.strip().strip('"').lower()
    return mime.strip().lower(), values


def whole_number(text: str) -> int | None:
    """`text` as a number of at most 9 ASCII digits (no rate or channel count is longer; int() raises past 4300),
    else None (int() also reads `٤٤١٠٠`, `+8000` and `8_000`). Raises nothing."""
    return int(text) if len(text) <= 9 and text.isascii() and text.isdigit() else None
