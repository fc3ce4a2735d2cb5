"""POST /v1/audio/translations: an uploaded file → its speech in English (Whisper's translate task; an English-only
model's transcription), in the asked format or streamed. The transcription route's path
(transcriptions.respond_to_upload) with OpenAI's translation fields and vLLM's `language` and `stream`."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request, Response, post
from litestar.enums import RequestEncodingType
from litestar.params import Body

from service.http.openapi import ok_content_operation
from service.speech.schemas import TranslationForm
from service.speech.transcriptions import FILE_PARTS, OK_CONTENT, SPEECH_ERRORS, respond_to_upload

__all__ = ["create_translation"]


@post("/v1/audio/translations", status_code=200, tags=["audio"], summary="Translate an audio file into English",
      responses=SPEECH_ERRORS, before_request=FILE_PARTS,
      operation_class=ok_content_operation(OK_CONTENT, "TranslationOperation"),
      description="OpenAI-compatible: the speech's text in English (Whisper's translate task). On an English-only "
                  "model (`*.en`, the demo's tiny.en) it is the speech's transcription, as faster-whisper and "
                  "openai-whisper run it: English is the one language it has. As vLLM's, `language` names the "
                  "speech's language (the decoder's hint) and `stream=true` answers text/event-stream, with the "
                  "transcription route's events: `transcript.text.delta`, then `transcript.text.done`.")
async def create_translation(
    request: Request[Any, Any, Any],
    data: Annotated[TranslationForm, Body(media_type=RequestEncodingType.MULTI_PART)],
) -> Response[Any]:
    """Raises APIError (400 bad audio/params, 404 model, 413 size, 503 load failure)."""
    # Subtitle tools call /translations whatever the model: an English-only one answers with its English text.
    return await respond_to_upload(request, data, {"task": "translate", "english_only_transcribes": True,
                                                   "language": data.language}, stream=data.stream)
