"""Transcript renderings: text, json, verbose_json (OpenAI's fields), srt and vtt."""

from __future__ import annotations

import re
from typing import Any, Literal, get_args

from audio.transcript import TokenCounts, Transcript

__all__ = ["ResponseFormat", "RESPONSE_FORMATS", "render", "media_type", "timestamp", "language_name", "text_language",
           "usage", "token_usage"]

ResponseFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]
RESPONSE_FORMATS: tuple[str, ...] = get_args(ResponseFormat)


def timestamp(seconds: float, *, decimal: str = ".", always_hours: bool = True) -> str:
    """`HH:MM:SS.mmm` (vtt) or `HH:MM:SS,mmm` (srt). Raises ValueError for a negative time."""
    if seconds < 0:
        raise ValueError(f"negative timestamp {seconds}")
    ms = round(seconds * 1000.0)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    head = f"{hours:02d}:" if always_hours or hours else ""
    return f"{head}{minutes:02d}:{secs:02d}{decimal}{ms:03d}"


# What ends a line in a cue file (SRT's and WebVTT's: CRLF, CR or LF); a blank one ends the cue.
_LINE_END = re.compile(r"\r\n|\r|\n")
# WebVTT cue text is markup: & and < start escapes and tags; > is escaped too, as "-->" must not appear.
_VTT_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def _cues(t: Transcript) -> list[tuple[float, float, str]]:
    """Each segment with text as a cue's times and text: "-->" made "->" (openai-whisper's writers: the arrow would
    read as a timing line) and blank lines dropped (a blank line ends the cue)."""
    cues = []
    for s in t.segments:
        lines = [line for line in _LINE_END.split(s.text.strip().replace("-->", "->")) if line.strip()]
        if lines:
            cues.append((s.start, max(s.end, s.start), "\n".join(lines)))
    return cues


def _srt(t: Transcript) -> str:
    blocks = [
        f"{i}\n{timestamp(a, decimal=',')} --> {timestamp(b, decimal=',')}\n{text}\n"
        for i, (a, b, text) in enumerate(_cues(t), start=1)
    ]
    return "\n".join(blocks)


def _vtt(t: Transcript) -> str:
    blocks = [f"{timestamp(a)} --> {timestamp(b)}\n{text.translate(_VTT_ESCAPES)}\n" for a, b, text in _cues(t)]
    return "WEBVTT\n\n" + "\n".join(blocks)


def usage(t: Transcript | float) -> dict[str, Any]:
    """OpenAI's usage of a Whisper transcription (or of `t` seconds of audio): the audio's seconds."""
    return {"type": "duration", "seconds": round(t.duration if isinstance(t, Transcript) else t, 3)}


def token_usage(t: Transcript | TokenCounts) -> dict[str, Any] | None:
    """OpenAI's token usage (a streamed transcription's, whose done event takes no duration usage) from what the
    decoding counted (a Transcript's `tokens`, or the counts themselves): input = the prompt's tokens Whisper read +
    its encoder positions of the audio (50 a second), output = the text tokens written; None where the Transcript
    has no counts. Raises nothing."""
    if (n := t.tokens if isinstance(t, Transcript) else t) is None:
        return None
    return {"type": "tokens", "input_tokens": n.prompt + n.audio,
            "input_token_details": {"text_tokens": n.prompt, "audio_tokens": n.audio},
            "output_tokens": n.output, "total_tokens": n.prompt + n.audio + n.output}


def language_name(code: str) -> str:
    """Whisper's name for a language code ("en" → "english"), as OpenAI's verbose_json gives it; an unknown code as
    it is. Raises nothing."""
    from mlx_whisper.tokenizer import LANGUAGES

    return LANGUAGES.get(code, code)


def text_language(t: Transcript) -> str:
    """The language of `t`'s text by Whisper's name: "english" for a translation (OpenAI: a translation's
    `language` is always english, the output's), else the spoken one. Raises nothing."""
    return "english" if t.task == "translate" else language_name(t.language)


def _verbose(t: Transcript, words: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "task": t.task,
        "language": text_language(t),
        "duration": round(t.duration, 3),
        "text": t.text.strip(),
        "segments": [s.as_dict(with_words=False) for s in t.segments],
    }
    if words:
        # OpenAI's words carry no leading space (Whisper's tokens do: " And").
        body["words"] = [{**w.as_dict(), "word": w.word.strip()} for w in t.words]
    body["usage"] = usage(t)
    return body


def render(t: Transcript, fmt: str, *, words: bool = False) -> str | dict[str, Any]:
    """The response body: a dict for json/verbose_json, a string otherwise. `words` adds the flat word
    list to verbose_json (timestamp_granularities=["word"]). Raises ValueError for an unknown format."""
    if fmt == "json":  # the text as OpenAI gives it: no leading space (its segments keep theirs)
        return {"text": t.text.strip(), "usage": usage(t)}
    if fmt == "verbose_json":
        return _verbose(t, words)
    if fmt == "text":
        return t.text.strip() + "\n" if t.text.strip() else ""
    if fmt == "srt":
        return _srt(t)
    if fmt == "vtt":
        return _vtt(t)
    raise ValueError(f"unknown response_format {fmt!r}; expected one of {', '.join(RESPONSE_FORMATS)}")


def media_type(fmt: str) -> str:
    """The HTTP content type for a format. Raises nothing (unknown → text/plain)."""
    return {"json": "application/json", "verbose_json": "application/json",
            "vtt": "text/vtt"}.get(fmt, "text/plain")
