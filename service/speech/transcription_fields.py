"""Transcription fields the file routes and the live sessions read alike: `keywords` (Whisper takes vocabulary as
prompt text: joined after the prompt; speaches' `hotwords` string is the same list), where a session's
transcription object holds the speech service's options (`languages`, those the speech may be in, is read by the
service: audio/transcript.spoken_languages) and server VAD's settings (webrtcvad's aggressiveness from `threshold`,
the padding and the pause that ends speech), and the `languages` an answer names.
"""

from __future__ import annotations

from typing import Any, Sequence

from audio.formats import token_usage, usage
from audio.transcript import iso_language
from service.seams import SpeechBackend

__all__ = ["joined_prompt", "hotword_list", "transcription_params", "aggressiveness", "vad_options",
           "LANGUAGES_MODELS", "detected_languages", "TOKEN_USAGE_MODELS", "utterance_usage"]

# OpenAI's ids whose transcriptions carry `languages` (openai-python's Transcription, TranscriptionTextDoneEvent and
# ...InputAudioTranscriptionCompletedEvent: "Returned by `gpt-transcribe`"; gpt-live-transcribe is its Realtime form,
# whose `.completed` LiveKit reads them from); the other ids' answers keep the shape OpenAI gives them
LANGUAGES_MODELS = frozenset({"gpt-transcribe", "gpt-live-transcribe"})
# OpenAI's ids billed by tokens, whose answers' `usage` is `{"type": "tokens", ...}` (openai-python's Transcription and
# ...InputAudioTranscriptionCompletedEvent take either kind); whisper-1's and those priced by the minute
# (gpt-transcribe, gpt-live-transcribe, gpt-realtime-whisper), as the served model's own names, `{"type": "duration"}`
TOKEN_USAGE_MODELS = frozenset({"gpt-4o-transcribe", "gpt-4o-mini-transcribe", "gpt-4o-mini-transcribe-2025-12-15"})


def joined_prompt(prompt: str | None, keywords: Sequence[str]) -> str | None:
    """The prompt with the keywords joined after it (None when both are empty). Raises nothing."""
    words = ", ".join(w.strip() for w in keywords if w.strip())
    return " ".join(p for p in (prompt or "", words) if p) or None


def hotword_list(hotwords: str | None) -> list[str]:
    """speaches' `hotwords` as keywords: its comma-separated phrases (faster-whisper reads the string whole as prompt
    text, so a phrase's words stay together and joined_prompt gives that text back). Raises nothing."""
    return [w.strip() for w in (hotwords or "").split(",") if w.strip()]


def transcription_params(where: str, languages: int) -> dict[str, str]:
    """The speech service's names for a refused option → where a session's transcription object at `where` holds
    it (`languages` entries: `languages` of them). Raises nothing."""
    return {"language": f"{where}.language", "prompt": f"{where}.prompt", "languages": f"{where}.languages",
            **{f"languages[{i}]": f"{where}.languages[{i}]" for i in range(languages)}}


def aggressiveness(threshold: float) -> int:
    """webrtcvad's aggressiveness for server VAD's `threshold` (0–0.25 → 0, … 0.75–1 → 3). Raises nothing."""
    return min(3, int(threshold * 4))


def vad_options(threshold: float | None, prefix_padding_ms: int | None,
                silence_duration_ms: int | None) -> dict[str, int]:
    """Server VAD's settings as the speech service's options: `prefix_padding_ms` pads speech on both sides,
    `silence_duration_ms` is the pause that ends it; those not given are left out (the service's defaults). Raises
    nothing."""
    out = {"vad_aggressiveness": None if threshold is None else aggressiveness(threshold),
           "vad_padding_ms": prefix_padding_ms, "vad_min_silence_ms": silence_duration_ms}
    return {k: v for k, v in out.items() if v is not None}


def detected_languages(model: str | None, language: str | None, text: str) -> list[dict[str, str]] | None:
    """OpenAI's `languages` for a transcription asked of `model`: `[{"code": ...}]`, the language Whisper decoded
    `text` in (`language`, Whisper's code: given, English for an English-only model, else detected); `[]` where there
    is no text (no language heard: OpenAI's "no language could be reliably detected"); None (left out) for a model
    OpenAI returns none for. Raises nothing."""
    if model not in LANGUAGES_MODELS:
        return None
    return [{"code": iso_language(language)}] if language and text.strip() else []


def utterance_usage(speech: SpeechBackend, model: str | None, prompt: str | None, text: str,
                    seconds: float) -> dict[str, Any]:
    """A Realtime transcript's usage for `seconds` of audio, as OpenAI's for `model`: in tokens for those it bills by
    tokens (counted as a file's: SpeechBackend.token_counts), else the seconds. Raises what token_counts raises
    (nothing but an engine process gone, under --isolate)."""
    if model in TOKEN_USAGE_MODELS and (spent := token_usage(speech.token_counts(prompt, text, seconds))) is not None:
        return spent
    return usage(seconds)
