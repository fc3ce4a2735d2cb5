"""Pydantic models of the speech API's file routes (/v1/audio/transcriptions, /translations) — their forms and
answers, the OpenAPI source; live sessions' and client secrets' are service/speech/session_schemas.py."""

from __future__ import annotations

import json
import re
from typing import Any, Literal, get_args

from litestar.datastructures import UploadFile
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from audio.formats import ResponseFormat
from service.speech.transcription_fields import hotword_list

__all__ = [
    "TranslationForm",
    "TranscriptionForm",
    "ServerVadChunking",
    "TranscriptionWord",
    "TranscriptionLogprob",
    "TranscriptionLanguage",
    "TranscriptionSegment",
    "Transcription",
    "VerboseTranscription",
    "TranscriptTextDelta",
    "TranscriptTextDone",
    "DurationUsage",
    "TokenUsage",
]

Granularity = Literal["segment", "word"]


def _segments_only() -> list[Granularity]:
    return ["segment"]


_INDEXED = re.compile(r"^(\w+)\[(\d+)\]$")


def _entries(value: object) -> list[object]:
    return value if isinstance(value, list) else [value]  # a repeated form field arrives as a list


def _shown(value: object) -> str:
    # a form value may be megabytes: echoed whole, the 400 was as large
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "…"


class TranslationForm(BaseModel):
    """multipart/form-data body of POST /v1/audio/translations (OpenAI's fields): the speech in English. A field
    we do not know is refused by name, as every value we cannot honour. Its fields open the transcription's too."""

    model_config = ConfigDict(arbitrary_types_allowed=True, populate_by_name=True, extra="forbid")

    file: UploadFile = Field(description="Audio: wav, mp3, m4a, flac, ogg, webm … (decoded with PyAV).")
    model: str = Field("whisper-1", description="The Whisper model served here (any alias of it).")
    prompt: str | None = Field(None, description="Text to condition the first window on (spelling, vocabulary).")
    response_format: ResponseFormat = "json"
    temperature: float = Field(0.0, ge=0.0, le=1.0, description="Start of the fallback ladder (0 → 0, 0.2 … 1.0).")
    language: str | None = Field(None, description="The speech's language: ISO-639-1 code (or name); detected when "
                                                    "omitted.")
    stream: bool = Field(False, description="SSE: transcript.text.delta events, then transcript.text.done.")

    @field_validator("stream")
    @classmethod
    def _streams_text(cls, stream: bool, info: ValidationInfo) -> bool:
        fmt = info.data.get("response_format", "json")
        if stream and fmt not in ("json", "text"):
            raise ValueError(f"a streamed transcription sends text events: response_format {fmt} cannot be streamed")
        return stream


class ServerVadChunking(BaseModel):
    """`chunking_strategy`'s server_vad object (OpenAI's fields): the file cut at the pauses voice activity detection
    finds, as "auto", with these settings; those left out are auto's. As a live session's server VAD reads them."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["server_vad"]
    threshold: float | None = Field(None, ge=0.0, le=1.0, description="webrtcvad's aggressiveness: 0–0.25 → 0, "
                                                                      "… 0.75–1 → 3 (auto: 2).")
    prefix_padding_ms: int | None = Field(None, ge=0, le=2000, description="Speech padding, both sides (auto: 200).")
    silence_duration_ms: int | None = Field(None, ge=30, le=10_000,
                                            description="The pause that ends speech (auto: 500).")


class TranscriptionForm(TranslationForm):
    """multipart/form-data body of POST /v1/audio/transcriptions (OpenAI's fields). A field we do not know
    (`known_speaker_names[]`, …) is refused by name, as every value we cannot honour."""

    languages: list[str] = Field(default_factory=list, alias="languages[]",
                                 description="The languages the speech may be in (codes or names): Whisper detects "
                                             "it among these only. One entry is the language; `language` sent "
                                             "beside them must be one of them.")
    keywords: list[str] = Field(default_factory=list, alias="keywords[]",
                                description="Words or phrases to bias toward: joined after the prompt, as on the live "
                                            "sockets.")
    hotwords: str | None = Field(None, description="speaches' (faster-whisper's) name for keywords: one string, its "
                                                   "phrases separated by commas.")
    timestamp_granularities: list[Granularity] = Field(
        default_factory=_segments_only, alias="timestamp_granularities[]",
        description="`word` adds word timestamps, with verbose_json only; `segment` (the default) is taken with "
                    "any format, as OpenAI's.")
    task: Literal["transcribe", "translate"] = Field("transcribe", description="Extension: translate into English.")
    vad: bool | None = Field(None, description="Extension: Whisper sees only the speech (webrtcvad); silence is cut "
                                               "out and times are mapped back. Default: on, unless the server runs "
                                               "with --no-vad.")
    vad_filter: bool | None = Field(None, description="speaches' (faster-whisper's) name for vad.")
    without_timestamps: bool = Field(False, description="Extension (speaches'): decode without timestamp tokens; "
                                                        "segments are Whisper's windows.")
    vad_trim: bool = Field(False, description="Extension: with vad off, cut leading/trailing silence before decoding "
                                              "(refused with vad on, which decodes only the speech already).")
    chunking_strategy: Literal["auto"] | ServerVadChunking | None = Field(
        None, description='"auto": the audio is cut at pauses found by voice activity detection (as vad on); a '
                          "server_vad object (as form parts or one JSON string) sets how.")
    include: list[str] | None = Field(
        None, alias="include[]", description="`logprobs`: the JSON answer (response_format json only, as OpenAI's) "
                                             "and the streamed events carry the log probabilities of the tokens "
                                             "Whisper wrote their text with.")

    @model_validator(mode="before")
    @classmethod
    def _indexed_entries(cls, data: Any) -> Any:
        # qs and axios send an array as `name[0]`, `name[1]` parts: read as `name[]`'s entries, in index order
        if not isinstance(data, dict):
            return data
        arrays = {f.alias[:-2] for f in cls.model_fields.values() if f.alias and f.alias.endswith("[]")}
        indexed = sorted((m[1], int(m[2]), k) for k in data
                         if isinstance(k, str) and (m := _INDEXED.match(k)) and m[1] in arrays)
        if not indexed:
            return data
        out = {k: v for k, v in data.items() if k not in {key for *_, key in indexed}}
        for name, _, key in indexed:
            out[f"{name}[]"] = [*_entries(out.get(f"{name}[]", [])), *_entries(data[key])]
        return out

    @model_validator(mode="before")
    @classmethod
    def _objects_in_brackets(cls, data: Any) -> Any:
        # The SDK sends an object field as `name[key]` parts: gathered under its name, so its refusal names it.
        if isinstance(data, dict) and any(isinstance(k, str) and k.startswith("chunking_strategy[") for k in data):
            data = {k: v for k, v in data.items() if not (isinstance(k, str) and k.startswith("chunking_strategy["))} \
                | {"chunking_strategy": {k[18:-1]: v for k, v in data.items()
                                         if isinstance(k, str) and k.startswith("chunking_strategy[")}}
        return data

    @field_validator("chunking_strategy", mode="before")
    @classmethod
    def _object_as_json(cls, value: Any) -> Any:
        # One form field may carry the object as JSON: read as the SDK's form parts are, so either is told the same
        if isinstance(value, str) and value != "auto":
            try:
                value = json.loads(value)
            except ValueError:
                value = None
            if not isinstance(value, dict):
                raise ValueError('use "auto" or a server_vad object ({"type": "server_vad", ...}, as JSON here)')
        return value

    @field_validator("languages", "keywords", mode="before")
    @classmethod
    def _one_is_a_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value  # one form field arrives as a plain string

    @field_validator("hotwords")
    @classmethod
    def _hotwords_are_keywords(cls, value: str | None, info: ValidationInfo) -> str | None:
        keywords = [k.strip() for k in info.data.get("keywords") or [] if k.strip()]
        if value is not None and keywords and hotword_list(value) != keywords:
            raise ValueError("hotwords (speaches' name) and keywords[] name different words: send one of them")
        return value

    @field_validator("vad_filter")
    @classmethod
    def _vad_filter_is_vad(cls, value: bool | None, info: ValidationInfo) -> bool | None:
        vad = info.data.get("vad")
        if value is not None and vad is not None and value != vad:
            raise ValueError(f"vad_filter {str(value).lower()} (speaches' name for vad) contradicts vad "
                             f"{str(vad).lower()}: send one of them")
        return value

    @field_validator("include", mode="before")
    @classmethod
    def _logprobs_included(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None or value == []:
            return value
        values = value if isinstance(value, list) else [value]  # one form field arrives as a plain string
        other = [v for v in values if v != "logprobs"]
        if other:
            raise ValueError(f"{', '.join(_shown(v) for v in other[:3])} cannot be included: logprobs is the one "
                             "include value")
        fmt = info.data.get("response_format", "json")
        if fmt != "json":  # OpenAI's rule: the other formats have nowhere to put them
            raise ValueError(f"logprobs are given with response_format json only, not {fmt}")
        return values

    @field_validator("timestamp_granularities", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        # A form with one `timestamp_granularities[]` field arrives as a plain string; each value is checked here,
        # so a refusal names the field, not its `.0`.
        values = [value] if isinstance(value, str) else value
        for v in values if isinstance(values, list) else []:
            if v not in get_args(Granularity):
                raise ValueError(f"{_shown(v)} is not a timestamp granularity: use segment or word")
        return values

    @field_validator("timestamp_granularities")
    @classmethod
    def _words_in_verbose_json(cls, value: list[Granularity], info: ValidationInfo) -> list[Granularity]:
        # `segment` is OpenAI's default and asks nothing more, so OpenAI takes it with any format (the AI SDK always
        # sends it); `word` elsewhere than verbose_json would be dropped unseen, so it is refused by name
        fmt = info.data.get("response_format", "json")
        if "word" in value and fmt != "verbose_json":
            raise ValueError(f"word timestamps are chosen only with response_format verbose_json, not {fmt}")
        return value

    @field_validator("chunking_strategy")
    @classmethod
    def _chunking_is_vad(cls, value: str | ServerVadChunking | None,
                         info: ValidationInfo) -> str | ServerVadChunking | None:
        if value is not None and False in (info.data.get("vad"), info.data.get("vad_filter")):
            raise ValueError("chunking cuts at voice activity: it cannot be had with vad false")
        return value


class TranscriptionWord(BaseModel):
    word: str
    start: float
    end: float


class TranscriptionSegment(BaseModel):
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float


class TranscriptionLogprob(BaseModel):
    """A token Whisper wrote the text with (include[]=logprobs): its text, log probability and bytes; an answer's
    tokens' bytes join to exactly its text."""

    token: str
    logprob: float
    bytes: list[int]


_LOGPROBS = "With include[]=logprobs: the log probabilities of the tokens of its text."


class TranscriptionLanguage(BaseModel):
    """A language heard in the audio (OpenAI's TranscriptionLanguage)."""

    code: str = Field(description="ISO 639-1 (`en`).")


_LANGUAGES = ("For model gpt-transcribe or gpt-live-transcribe (as OpenAI's): the language Whisper transcribed the "
              "speech in (given, English for an English-only model, else detected); empty when no speech was heard.")


_USAGE = ("As OpenAI's for the model asked for: tokens for gpt-4o-transcribe and gpt-4o-mini-transcribe (counted as "
          "a stream's), else the audio's seconds.")


class DurationUsage(BaseModel):
    """What a Whisper transcription used: seconds of audio."""

    type: Literal["duration"] = "duration"
    seconds: float


class InputTokenDetails(BaseModel):
    text_tokens: int = Field(description="The prompt's tokens Whisper read (at most its last 223).")
    audio_tokens: int = Field(description="Whisper's encoder positions of the audio it decoded: 50 a second (with "
                                          "VAD, of the speech only).")


class TokenUsage(BaseModel):
    """What a transcription used, in tokens (OpenAI's usage for models billed by tokens): a stream's, and a json
    answer's for model gpt-4o-transcribe or gpt-4o-mini-transcribe."""

    type: Literal["tokens"] = "tokens"
    input_tokens: int = Field(description="text_tokens + audio_tokens.")
    input_token_details: InputTokenDetails
    output_tokens: int = Field(description="The text tokens Whisper wrote (timestamp and special tokens not counted).")
    total_tokens: int


class Transcription(BaseModel):
    """response_format=json."""

    text: str
    usage: DurationUsage | TokenUsage = Field(description=_USAGE)
    languages: list[TranscriptionLanguage] | None = Field(None, description=_LANGUAGES)
    logprobs: list[TranscriptionLogprob] | None = Field(None, description=_LOGPROBS)


class VerboseTranscription(BaseModel):
    """response_format=verbose_json."""

    task: Literal["transcribe", "translate"] = "transcribe"
    language: str = Field(description='Whisper\'s name for it, as OpenAI gives it ("english").')
    duration: float
    text: str
    segments: list[TranscriptionSegment] = Field(default_factory=list)
    words: list[TranscriptionWord] | None = None
    usage: DurationUsage


class TranscriptTextDelta(BaseModel):
    """One SSE event of a streamed transcription: text of the segments one window produced."""

    type: Literal["transcript.text.delta"] = "transcript.text.delta"
    delta: str
    logprobs: list[TranscriptionLogprob] | None = Field(None, description=_LOGPROBS)


class TranscriptTextDone(BaseModel):
    """The last SSE event of a streamed transcription; its usage in tokens, the one kind OpenAI's event takes."""

    type: Literal["transcript.text.done"] = "transcript.text.done"
    text: str
    usage: TokenUsage | None = None
    languages: list[TranscriptionLanguage] | None = Field(None, description=_LANGUAGES)
    logprobs: list[TranscriptionLogprob] | None = Field(None, description=_LOGPROBS)
