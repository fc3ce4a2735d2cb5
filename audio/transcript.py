"""Plain value types of speech work: what to do (TranscribeOptions) and what came out (Transcript)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from audio.agreement import MOST_DECODES
from audio.errors import InvalidOption
from audio.noise_reduction import KINDS as NOISE_KINDS

__all__ = ["TokenLogprob", "normalize_language", "iso_language", "spoken_languages", "Task", "TranscribeOptions",
           "Word", "Segment", "TokenCounts", "Transcript", "DEFAULT_TEMPERATURES", "PromptTooLong", "MAX_PROMPT_CHARS"]


@dataclass(frozen=True)
class TokenLogprob:
    """A text token Whisper sampled, with its log probability and its bytes (audio/token_logprobs.py makes them)."""

    token: str
    logprob: float
    bytes: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"token": self.token, "logprob": self.logprob, "bytes": list(self.bytes)}

Task = Literal["transcribe", "translate"]
DEFAULT_TEMPERATURES: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
# Whisper reads at most the last 223 tokens of prompt and previous text; ~9 characters a token is generous.
MAX_PROMPT_CHARS = 2000


class PromptTooLong(InvalidOption):
    """The prompt (or vocabulary) is longer than Whisper could ever use (param "prompt")."""

    code = "prompt_too_long"

    def __init__(self, message: str) -> None:
        super().__init__(message, param="prompt")


@dataclass(frozen=True)
class TranscribeOptions:
    """Decoding settings, named as in openai-whisper's transcribe(). `temperatures` is the fallback
    ladder: the next one is tried when a window's text is too repetitive or too improbable."""

    language: str | None = None
    # With no `language`: the languages the speech may be in (OpenAI's `languages`, Whisper's codes), detection
    # chooses among them (audio/decoder.detect_language); empty: among all.
    languages: tuple[str, ...] = ()
    task: Task = "transcribe"
    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    condition_on_previous_text: bool = True
    prompt: str | None = None
    without_timestamps: bool = False
    word_timestamps: bool = False
    # webrtcvad: with `vad` Whisper sees only speech (silences of vad_min_silence_ms and more are cut out,
    # times mapped back; speech padded by vad_padding_ms each side); `vad_trim` without `vad` cuts only
    # leading/trailing silence. vad_aggressiveness: webrtcvad's 0 (lets most through) to 3 (strictest).
    vad: bool = True
    vad_trim: bool = False
    vad_min_speech_ms: int = 250
    vad_min_silence_ms: int = 500
    vad_padding_ms: int = 200
    vad_aggressiveness: int = 2
    # > 1: cut the file at silences and decode this many ≤30 s chunks per task in one batched call
    # (audio/batching.py); no conditioning across chunks. 1: the sequential seek loop.
    batch_size: int = 1
    # Live sessions only (audio/sessions.py): the input audio's high-pass filter (audio/noise_reduction.py; None:
    # none). `logprobs`: each decoded text token's log probability is kept (a file's segments and Transcript carry
    # them; a live session's committed text, audio/live.py). `agreement`: how many consecutive decodes of a live
    # session must agree before text is committed (audio/agreement.py; a Realtime session's `delay`).
    noise_reduction: str | None = None
    logprobs: bool = False
    agreement: int = 2

    def __post_init__(self) -> None:
        if self.prompt is not None and len(self.prompt) > MAX_PROMPT_CHARS:
            raise PromptTooLong(f"prompt (with any keywords joined after it) is {len(self.prompt)} characters; at most "
                                f"{MAX_PROMPT_CHARS} are accepted "
                                "(Whisper reads only its last 223 tokens)")
        if self.noise_reduction is not None and self.noise_reduction not in NOISE_KINDS:
            raise InvalidOption(f"noise_reduction must be one of {', '.join(NOISE_KINDS)}", param="noise_reduction")
        if not 1 <= self.agreement <= MOST_DECODES:
            raise InvalidOption(f"agreement must be 1-{MOST_DECODES}", param="agreement")
        if not self.temperatures:
            raise ValueError("temperatures must not be empty")
        if not 0 <= self.vad_aggressiveness <= 3:
            raise InvalidOption("vad_aggressiveness must be 0-3", param="vad_aggressiveness")
        for name in ("vad_min_speech_ms", "vad_min_silence_ms", "vad_padding_ms"):
            if not 0 <= getattr(self, name) <= 10_000:
                raise InvalidOption(f"{name} must be 0-10000", param=name)

    @property
    def named_language(self) -> str:
        """The language a transcript names before one is detected (no speech): the given one, else the first it
        may be in, else English, as openai-whisper's. Raises nothing."""
        return self.language or (self.languages[0] if self.languages else "en")

    @property
    def gate_settings(self) -> dict[str, int]:
        """The VAD gate's settings (audio/vad.py SpeechGate's keywords), for files and live sessions alike."""
        return {"min_speech_ms": self.vad_min_speech_ms, "min_silence_ms": self.vad_min_silence_ms,
                "padding_ms": self.vad_padding_ms, "aggressiveness": self.vad_aggressiveness}

    @staticmethod
    def ladder(temperature: float | None, fallback: bool = True) -> tuple[float, ...]:
        """The temperatures to try: from `temperature` up to 1.0 in 0.2 steps, or just it without fallback."""
        t = 0.0 if temperature is None else float(temperature)
        if not fallback:
            return (t,)
        return (t,) + tuple(x for x in DEFAULT_TEMPERATURES if x > t + 1e-9)


@dataclass
class Word:
    word: str
    start: float
    end: float
    probability: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"word": self.word, "start": self.start, "end": self.end, "probability": self.probability}


@dataclass
class Segment:
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int] = field(default_factory=list)
    temperature: float = 0.0
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    no_speech_prob: float = 0.0
    words: list[Word] = field(default_factory=list)
    # Its text's tokens' log probabilities (audio/token_logprobs.py: their bytes join to `text`); None: not kept.
    logprobs: tuple[TokenLogprob, ...] | None = None

    def as_dict(self, with_words: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id, "seek": self.seek, "start": self.start, "end": self.end, "text": self.text,
            "tokens": list(self.tokens), "temperature": self.temperature, "avg_logprob": self.avg_logprob,
            "compression_ratio": self.compression_ratio, "no_speech_prob": self.no_speech_prob,
        }
        if with_words and self.words:
            d["words"] = [w.as_dict() for w in self.words]
        return d


@dataclass(frozen=True)
class TokenCounts:
    """What a transcription cost Whisper, in tokens (OpenAI's token usage of a streamed transcription)."""

    prompt: int  # the client's prompt's tokens the decoder read (Whisper reads at most its last 223)
    audio: int  # encoder positions of the audio Whisper was given to decode: 50 a second (with VAD, of the speech)
    output: int  # the text tokens it wrote: the transcript's, timestamp and special tokens not counted


@dataclass
class Transcript:
    """The result of a file or a finished session; `duration` is the audio length in seconds."""

    text: str
    language: str
    duration: float
    task: Task = "transcribe"
    segments: list[Segment] = field(default_factory=list)
    # Its text's tokens' log probabilities, its segments' one after another (bytes joined: `text`); None: not kept
    # (not asked for, or not known for all of it).
    logprobs: tuple[TokenLogprob, ...] | None = None
    # Its cost in tokens, where the decoding counted it (a file's); None: not counted (a live session's).
    tokens: TokenCounts | None = None

    @property
    def words(self) -> list[Word]:
        return [w for s in self.segments for w in s.words]


# ISO 639-1 codes Whisper spells otherwise: Javanese is `jw` in its tokenizer.
_WHISPER_CODES = {"jv": "jw"}


def iso_language(code: str) -> str:
    """Whisper's code for a language as ISO 639-1 writes it (`jw` → `jv`), as OpenAI's answers name it. Raises
    nothing."""
    return next((iso for iso, whisper in _WHISPER_CODES.items() if whisper == code), code)


def normalize_language(language: str | None, *, multilingual: bool = True,
                       num_languages: int | None = None) -> str | None:
    """`English`/`EN`/`en` → `en` (`jv` → Whisper's `jw`); None stays None (detect). `num_languages`: how many of
    Whisper's languages the model has tokens for (99 before large-v3, which added Cantonese; None: all). Raises
    InvalidOption (param "language") for an unknown language, one the model has no token for, or, on an
    English-only model, any language but English."""
    if language is None or not language.strip():
        return None
    from mlx_whisper.tokenizer import LANGUAGES, TO_LANGUAGE_CODE

    key = language.strip().lower()
    key = _WHISPER_CODES.get(key, key)
    code = key if key in LANGUAGES else TO_LANGUAGE_CODE.get(key)
    # a long value is shown cut: echoed whole, a 1 MB language made a 1 MB error
    shown = repr(language) if len(language) <= 40 else repr(language[:40]) + "…"
    if code is None:
        raise InvalidOption(f"unsupported language {shown}; use an ISO-639-1 code such as 'en' or 'de'",
                            param="language")
    if not multilingual and code != "en":
        raise InvalidOption(f"this Whisper model is English-only; language {shown} is not available",
                            param="language")
    # The model's language tokens are the first num_languages of Whisper's list; a later one has no token.
    if num_languages is not None and code not in tuple(LANGUAGES)[:num_languages]:
        raise InvalidOption(f"this Whisper model knows {num_languages} languages and {LANGUAGES[code]} "
                            f"({shown}) is not one of them (a large-v3 model has it)", param="language")
    return code


def spoken_languages(language: str | None, languages: Sequence[str], *, multilingual: bool = True,
                     num_languages: int | None = None) -> tuple[str | None, tuple[str, ...]]:
    """`language` and `languages` (those the speech may be in) as a decode takes them: (the language, None to
    detect it; the codes detection chooses among, () for all). Each entry is read as `language` is, duplicates
    collapse, and one left is the language. Raises InvalidOption naming `language`, `languages[N]` (an entry that
    is empty, unknown, or not English on an English-only model) or `languages` (`language` not among them)."""
    code = normalize_language(language, multilingual=multilingual, num_languages=num_languages)
    codes: list[str] = []
    for i, entry in enumerate(languages):
        try:
            entry_code = normalize_language(entry, multilingual=multilingual, num_languages=num_languages)
        except InvalidOption as exc:
            raise InvalidOption(f"languages[{i}]: {exc.message}", param=f"languages[{i}]", code=exc.code) from None
        if entry_code is None:
            raise InvalidOption(f"languages[{i}] is empty; name a language, such as 'en'", param=f"languages[{i}]")
        if entry_code not in codes:
            codes.append(entry_code)
    if code is not None and codes and code not in codes:
        raise InvalidOption(f"language {code!r} is not among languages ({', '.join(codes)}): the speech is in one "
                            "of them; send language as one of them, or leave it out", param="languages")
    if code is None and len(codes) == 1:
        return codes[0], ()
    return code, () if code is not None else tuple(codes)
