"""POST /v1/audio/transcriptions: an uploaded file → a Transcript in the asked format, or an SSE stream; and
`respond_to_upload`, what it shares with /v1/audio/translations (translations.py).

The route parses and validates, hands numpy PCM to the SpeechService (audio/speech.py) and renders its
Transcript; every model touch happens there, as tasks on the shared driver loop.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any, AsyncGenerator, Mapping

import anyio
import numpy as np
from litestar import Request, Response, post
from litestar.datastructures import UploadFile
from litestar.enums import RequestEncodingType
from litestar.params import Body

from audio.errors import AudioError
from audio.formats import media_type, render, token_usage
from audio.pcm import SAMPLE_RATE, check_file_length
from audio.token_logprobs import TokenLogprob, less_leading, stripped_logprobs
from audio.transcript import MAX_PROMPT_CHARS, Segment, TranscribeOptions, Transcript
from service.http.disconnect import ClientDisconnected, run_while_connected
from service.http.errors import APIError, api_error, in_band_error
from service.http.multipart import file_parts
from service.http.openapi import error_responses, inline_json_schema, ok_content_operation, sse_event_schema
from service.http.idle_keepalive import kept_alive_while_idle
from service.http.sse import KEEPALIVE, EventSource, SSEStream, sse_data, sse_error
from service.seams import SpeechBackend
from service.speech.schemas import (
    ServerVadChunking,
    TokenUsage,
    Transcription,
    TranscriptionForm,
    TranscriptionLanguage,
    TranscriptTextDelta,
    TranscriptTextDone,
    TranslationForm,
    VerboseTranscription,
)
from service.speech.served import decode_audio_body, served_speech, transcribe_options
from service.speech.transcription_fields import (
    TOKEN_USAGE_MODELS,
    detected_languages,
    hotword_list,
    joined_prompt,
    vad_options,
)
from service.state import get_state

__all__ = ["create_transcription", "respond_to_upload", "SPEECH_ERRORS", "FILE_CONTENT", "OK_CONTENT", "FILE_PARTS",
           "part_content_type"]

_log = logging.getLogger("tandem.service")

SPEECH_ERRORS = error_responses({400: "Bad audio or parameters (OpenAI error shape)", 404: "Unknown model or session",
                                 409: "Session finished, deleted or expired", 413: "Body over the size limit"})

_TEXT = {"type": "string"}
# What the 200 carries, by response_format (json / verbose_json, text / srt, vtt), and with stream=true.
FILE_CONTENT: dict[str, dict[str, Any]] = {
    "application/json": {"oneOf": [inline_json_schema(Transcription), inline_json_schema(VerboseTranscription)]},
    "text/plain": {**_TEXT, "description": "response_format text or srt"},
    "text/vtt": {**_TEXT, "description": "response_format vtt"},
}
# the upload routes' `file` part is the file with or without a filename (the SDK's `file=(None, data, type)`)
_READ_FILE_PARTS = file_parts("file")


async def FILE_PARTS(request: Request[Any, Any, Any]) -> None:
    """The upload routes' `before_request`: a server with no Whisper says so before any word about the body (a
    fixed body would only meet the 404 next). Raises APIError 404, or what reading the form raises."""
    served_speech(get_state(request), None)
    await _READ_FILE_PARTS(request)
OK_CONTENT = FILE_CONTENT | {"text/event-stream": sse_event_schema(TranscriptTextDelta, TranscriptTextDone,
                                                                    done=False)}



@post("/v1/audio/transcriptions", status_code=200, tags=["audio"],
      summary="Transcribe an audio file", responses=SPEECH_ERRORS, before_request=FILE_PARTS,
      operation_class=ok_content_operation(OK_CONTENT, "TranscriptionOperation"),
      description="OpenAI-compatible. `stream=true` answers text/event-stream: `transcript.text.delta` events "
                  "(one per decoded window), then `transcript.text.done`.")
async def create_transcription(
    request: Request[Any, Any, Any],
    data: Annotated[TranscriptionForm, Body(media_type=RequestEncodingType.MULTI_PART)],
) -> Response[Any]:
    """Raises APIError (400 bad audio/params, 404 model, 413 size, 503 load failure)."""
    words = "word" in data.timestamp_granularities
    chunking = data.chunking_strategy
    keywords = data.keywords or hotword_list(data.hotwords)  # speaches' names: the same settings (checked alike)
    asked: dict[str, Any] = {
        "language": data.language, "languages": data.languages, "prompt": joined_prompt(data.prompt, keywords),
        "task": data.task, "word_timestamps": words, "vad_trim": data.vad_trim,
        "without_timestamps": data.without_timestamps,
        "vad": True if chunking is not None else data.vad if data.vad is not None else data.vad_filter}
    renamed = {"languages": "languages[]"}  # `language` not among them; an entry at fault is named `languages[N]`
    if keywords and len(data.prompt or "") <= MAX_PROMPT_CHARS:  # the keywords made it too long: name them
        renamed["prompt"] = "keywords[]" if data.keywords else "hotwords"
    if isinstance(chunking, ServerVadChunking):
        asked |= vad_options(chunking.threshold, chunking.prefix_padding_ms, chunking.silence_duration_ms)
    if data.include:  # logprobs, its one value: the decodes keep them only when asked
        asked["logprobs"] = True
    return await respond_to_upload(request, data, asked, stream=data.stream, renamed=renamed,
                                   segments="segment" in data.timestamp_granularities, languages=True)


async def respond_to_upload(request: Request[Any, Any, Any], data: TranslationForm, asked: Mapping[str, Any], *,
                            stream: bool = False, renamed: Mapping[str, str] | None = None,
                            segments: bool = True, languages: bool = False) -> Response[Any]:
    """Transcribe the form's file with the options `asked` (its temperature besides, its prompt unless asked names
    one), answered in its response_format, or as SSE events with `stream`. `renamed`: the request's names for the
    options' fields (a refused option may be another field's fault). `segments`: verbose_json lists them (False:
    words only, as OpenAI answers timestamp_granularities=["word"]). `languages`: the json answer and the done event
    name the language heard, for the models OpenAI's do (a transcription's, not a translation's). Raises APIError
    (400 bad audio/params, 404 model, 413 size, 503 load failure)."""
    state = get_state(request)
    speech = served_speech(state, data.model)
    raw = await data.file.read()
    _check_parts(data, raw, state.config.limits.max_part_bytes)  # sizes first: nothing else reads a huge part
    try:
        options = transcribe_options(speech, **{"prompt": data.prompt or None, **asked},
                                     temperatures=TranscribeOptions.ladder(data.temperature))
    except AudioError as exc:
        raise api_error(exc, params=renamed) from None
    content_type = part_content_type(data.file)
    most = state.config.limits.max_audio_seconds
    try:  # a client that leaves during the decode is not kept waiting on (the thread's result is dropped)
        pcm = await run_while_connected(request, lambda: anyio.to_thread.run_sync(
            lambda: decode_audio_body(raw, content_type, param="file", max_seconds=most), abandon_on_cancel=True))
    except ClientDisconnected:
        return Response(None, status_code=499)
    started = time.perf_counter()
    audio_seconds = len(pcm) / SAMPLE_RATE
    check_file_length(pcm)
    languages_model = data.model if languages else None
    if stream:
        events = _transcription_events(speech, pcm, options, state.metrics, languages_model)
        if state.config.sse_keepalive and state.task_group is not None:
            # A window can take tens of seconds beside chat: a proxy's idle timer must not cut the stream meanwhile.
            events = kept_alive_while_idle(events, lambda: KEEPALIVE, state.config.sse_keepalive, state.task_group)
        return SSEStream(EventSource(events))
    try:
        transcript = await run_while_connected(request, lambda: speech.transcribe(pcm, options))
    except ClientDisconnected:
        return Response(None, status_code=499)
    if state.metrics is not None:
        state.metrics.observe_transcription(audio_seconds, time.perf_counter() - started)
    body = render(transcript, data.response_format, words=options.word_timestamps)
    if isinstance(body, dict) and data.response_format == "verbose_json":
        body = _as_openai(body, segments=segments)
    heard = detected_languages(languages_model, transcript.language, transcript.text)
    if isinstance(body, dict) and data.response_format == "json" and heard is not None:  # OpenAI's Transcription's
        body["languages"] = heard
    spent = token_usage(transcript) if languages_model in TOKEN_USAGE_MODELS else None  # OpenAI's usage for its model
    if isinstance(body, dict) and data.response_format == "json" and spent is not None:  # verbose_json: whisper-1's
        body["usage"] = spent
    if isinstance(body, dict) and options.logprobs:  # json only (the form refuses the others)
        body["logprobs"] = _logprobs(transcript.logprobs, transcript.text)
    return Response(body, media_type=media_type(data.response_format), status_code=200)


def _as_openai(body: dict[str, Any], *, segments: bool) -> dict[str, Any]:
    """A verbose_json body as OpenAI shapes it: segments only when asked for. Raises nothing."""
    shaped = dict(body)
    if not segments:
        shaped.pop("segments", None)
    return shaped


def _logprobs(entries: tuple[TokenLogprob, ...] | None, text: str) -> list[dict[str, Any]] | None:
    """The log probabilities of `text.strip()`, the answer's text (`entries`: `text`'s), as OpenAI gives them; None
    where they are not known. Raises nothing."""
    return None if entries is None else [e.as_dict() for e in stripped_logprobs(entries, text)]


def _delta_logprobs(segments: list[Segment], delta: str, options: TranscribeOptions) -> list[dict[str, Any]] | None:
    """The log probabilities of `delta`, the text of `segments` (less its leading space, the first delta's); None
    where not asked for or not known. Raises nothing."""
    if not options.logprobs or any(s.logprobs is None for s in segments):
        return None
    entries = [e for s in segments for e in s.logprobs or ()]
    text = "".join(s.text for s in segments)
    return [e.as_dict() for e in less_leading(entries, len(text.encode()) - len(delta.encode()))]


def part_content_type(upload: UploadFile) -> str | None:
    """The file part's full Content-Type, parameters included (`audio/pcm;rate=48000;encoding=s16le`):
    Litestar's `content_type` drops them. Raises nothing."""
    for name, value in upload.headers.items():
        if name.lower() == "content-type":
            return value
    return upload.content_type


def _check_parts(data: TranslationForm, file: bytes, limit: int) -> None:
    """Raises APIError 413 naming the first part (the file or a form field) over `limit` bytes."""
    fields = {"file": len(file)}
    for name, value in [*data.model_dump(exclude={"file"}).items(), *(data.model_extra or {}).items()]:
        if isinstance(value, str):
            fields[name] = len(value.encode())
    for name, size in fields.items():
        if size > limit:
            raise APIError(413, f"The `{name}` part has {size} bytes; a part may have at most {limit}.",
                           param=name, code="part_too_large")


async def _transcription_events(speech: SpeechBackend, pcm: np.ndarray, options: TranscribeOptions,
                                metrics: Any, model: str | None = None) -> AsyncGenerator[bytes, None]:
    """`model`: the done event names the language heard if OpenAI's does for it (detected_languages)."""
    started = time.perf_counter()
    stream = speech.transcribe_stream(pcm, options)
    sent = ""  # the deltas so far, which add up to the done event's text (no leading space, as OpenAI's)
    try:
        async for item in stream:
            if isinstance(item, Transcript):
                if metrics is not None:
                    metrics.observe_transcription(len(pcm) / SAMPLE_RATE, time.perf_counter() - started)
                heard = detected_languages(model, item.language, item.text)
                spent = token_usage(item)  # OpenAI's done event takes token usage only (never a duration)
                yield sse_data(TranscriptTextDone(text=item.text.strip(),
                                                  usage=TokenUsage(**spent) if spent is not None else None,
                                                  languages=[TranscriptionLanguage(**x) for x in heard]
                                                  if heard is not None else None,
                                                  logprobs=_logprobs(item.logprobs, item.text)), exclude_none=True)
            elif delta := "".join(s.text for s in item).lstrip() if not sent else "".join(s.text for s in item):
                sent += delta
                yield sse_data(TranscriptTextDelta(delta=delta, logprobs=_delta_logprobs(item, delta, options)),
                               exclude_none=True)
    except Exception as exc:  # headers are out: report in-band (and say why here: the client alone saw it)
        _log.warning("transcription stream failed: %s", exc)
        yield sse_error(in_band_error(exc))
    finally:
        await stream.aclose()
