"""A text completion's `suffix` (editor autocomplete: code before and after the cursor): the prompt becomes the code
model's fill-in-the-middle prompt, built from its FIM tokens (engine/fim.py), and the reply is the text between."""

from __future__ import annotations

from dataclasses import dataclass

import anyio

from engine.fim import FimFormat, fim_format
from service.chat.completion_request import CompletionRequest
from service.chat.render import check_text_fits
from service.http.errors import APIError
from service.seams import ChatEngine
from service.state import AppState

__all__ = ["Infill", "requested_infill", "infill_tokens"]


@dataclass(frozen=True)
class Infill:
    """The model's FIM format and the request's suffix."""

    format: FimFormat
    suffix: str


def requested_infill(engine: ChatEngine, body: CompletionRequest) -> Infill | None:
    """The request's infill, or None without a suffix (an empty one included). Raises APIError 400 naming `suffix`
    for token-id prompts and for a model without fill-in-the-middle tokens."""
    if not body.suffix:
        return None
    if any(isinstance(item, list) for item in body.prompt_items()):
        # Token ids are already the model's own input: a client with them can write the FIM tokens itself.
        raise APIError(400, "suffix: goes with text prompts only; with token ids, send the model's own "
                            "fill-in-the-middle prompt as the tokens", param="suffix", code="invalid_value")
    found = fim_format(engine.tokenizer)
    if found is None:
        raise APIError(400, f"suffix: this model ({engine.model_name}) has no fill-in-the-middle tokens in its "
                            "vocabulary, so it cannot write text to fit before a suffix; serve a code model that has "
                            "them (Qwen2.5-Coder, StarCoder2, DeepSeek-Coder, CodeLlama, Codestral), or leave suffix "
                            "out", param="suffix", code="unsupported_value")
    return Infill(found, body.suffix)


async def infill_tokens(state: AppState, engine: ChatEngine, infill: Infill, prefix: str) -> list[int]:
    """The FIM prompt's token ids for the text before the cursor, tokenized in a worker thread. Raises APIError 400
    context_length_exceeded for text that cannot fit."""
    check_text_fits(len(prefix) + len(infill.suffix), engine, "prompt")  # before tokenizing text that cannot fit
    return await anyio.to_thread.run_sync(infill.format.encode, engine.tokenizer, prefix, infill.suffix,
                                          limiter=state.tokenize_limiter)
