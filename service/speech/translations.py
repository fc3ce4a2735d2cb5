"""POST /v1/audio/translations: an uploaded file → its speech in English (Whisper's translate task), in the asked
format. The transcription route's path (transcriptions.respond_to_upload) with OpenAI's translation fields."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request, Response, post
from litestar.enums import RequestEncodingType
from litestar.params import Body

from service.http.openapi import ok_content_operation
from service.speech.schemas import TranslationForm
from service.speech.transcriptions import FILE_CONTENT, FILE_PARTS, SPEECH_ERRORS, respond_to_upload

__all__ = ["create_translation"]


@post("/v1/audio/translations", status_code=200, tags=["audio"], summary="Translate an audio file into English",
      responses=SPEECH_ERRORS, before_request=FILE_PARTS,
      operation_class=ok_content_operation(FILE_CONTENT, "TranslationOperation"),
      description="OpenAI-compatible: the speech's text in English (Whisper's translate task; a multilingual "
                  "model only, an English-only one is a 400 naming `model`).")
async def create_translation(
    request: Request[Any, Any, Any],
    data: Annotated[TranslationForm, Body(media_type=RequestEncodingType.MULTI_PART)],
) -> Response[Any]:
    """Raises APIError (400 bad audio/params or an English-only model, 404 model, 413 size, 503 load failure)."""
    # Translating is the model's ability: the task's refusal names the field that chose the model.
    return await respond_to_upload(request, data, {"task": "translate"}, renamed={"task": "model"})
