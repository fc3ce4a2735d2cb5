"""POST /tokenize, POST /detokenize and GET /tokenizer_info, as vLLM serves them (at the root, not under /v1)."""

from __future__ import annotations

from typing import Any

import anyio
from litestar import Request, get, post

from service.chat.render import check_text_fits
from service.chat.request import chat_engine, vocab_size
from service.chat.routes import render_chat_prompt
from service.chat.schemas import ChatCompletionRequest
from service.http.errors import APIError
from service.http.openapi import CHAT_ERRORS
from service.seams import ChatTokenizer
from service.state import get_state
from service.tokenize.schemas import (DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse,
                                      TokenizerInfo)

__all__ = ["tokenize", "detokenize", "tokenizer_info"]


@post("/tokenize", status_code=200, summary="Tokenize text or a conversation", responses=CHAT_ERRORS,
      tags=["tokenizer"])
async def tokenize(request: Request[Any, Any, Any], data: TokenizeRequest) -> TokenizeResponse:
    """The served model's token ids for `prompt`, or for `messages` rendered as a chat request's prompt. Raises
    APIError 400 (a conversation the template refuses, text past the context) and 404 (another model)."""
    state = get_state(request)
    engine = chat_engine(state, data.model)
    tokenizer = _tokenizer(engine.tokenizer)
    if data.messages is not None:
        chat = ChatCompletionRequest.model_validate(
            {"messages": [m.model_dump(exclude_unset=True) for m in data.messages],
             **({"tools": [t.model_dump(exclude_unset=True) for t in data.tools]} if data.tools else {}),
             **({"chat_template_kwargs": data.chat_template_kwargs} if data.chat_template_kwargs else {})})
        tokens = await render_chat_prompt(state, engine, chat)
    else:
        assert data.prompt is not None  # the schema asks for one of the two
        check_text_fits(len(data.prompt), engine, "prompt")  # before tokenizing text that cannot fit
        special = data.add_special_tokens is not False
        encoded = await anyio.to_thread.run_sync(lambda: tokenizer.encode(data.prompt, add_special_tokens=special),
                                                 limiter=state.tokenize_limiter)
        tokens = [int(t) for t in encoded]
    strs = None
    if data.return_token_strs:
        strs = await anyio.to_thread.run_sync(_pieces, tokenizer, tokens, limiter=state.tokenize_limiter)
    return TokenizeResponse(count=len(tokens), max_model_len=engine.context_length, tokens=tokens, token_strs=strs)


@post("/detokenize", status_code=200, summary="Turn token ids back into text", responses=CHAT_ERRORS,
      tags=["tokenizer"])
async def detokenize(request: Request[Any, Any, Any], data: DetokenizeRequest) -> DetokenizeResponse:
    """The text of `tokens`. Raises APIError 400 for an id outside the vocabulary, 404 for another model."""
    state = get_state(request)
    engine = chat_engine(state, data.model)
    tokenizer = _tokenizer(engine.tokenizer)
    vocab = vocab_size(engine)
    if bad := [t for t in data.tokens if t < 0 or (vocab is not None and t >= vocab)]:
        raise APIError(400, f"tokens: token id {bad[0]} is outside the vocabulary (size {vocab})", param="tokens",
                       code="invalid_value")
    text = await anyio.to_thread.run_sync(tokenizer.decode, data.tokens, limiter=state.tokenize_limiter)
    return DetokenizeResponse(prompt=text)


@get("/tokenizer_info", summary="The tokenizer's special tokens and chat template", responses=CHAT_ERRORS,
     tags=["tokenizer"])
async def tokenizer_info(request: Request[Any, Any, Any]) -> TokenizerInfo:
    """What a client needs to tokenize as this server does. Raises APIError 404 without a chat model."""
    engine = chat_engine(get_state(request), None)
    tokenizer = _tokenizer(engine.tokenizer)
    inner = getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's wrapper holds the HF tokenizer
    template = getattr(inner, "chat_template", None)
    if isinstance(template, dict):  # named templates: the one a chat request uses
        template = template.get("default") or next(iter(template.values()), None)
    return TokenizerInfo(tokenizer_class=type(inner).__name__, model_max_length=engine.context_length,
                         vocab_size=vocab_size(engine), bos_token=_token(inner, "bos_token"),
                         eos_token=_token(inner, "eos_token"), pad_token=_token(inner, "pad_token"),
                         unk_token=_token(inner, "unk_token"),
                         chat_template=template if isinstance(template, str) else None)


def _tokenizer(tokenizer: ChatTokenizer | None) -> Any:
    assert tokenizer is not None  # chat_engine returns only an engine serving a chat model
    return tokenizer


def _token(tokenizer: Any, name: str) -> str | None:
    value = getattr(tokenizer, name, None)
    return value if isinstance(value, str) else None


def _pieces(tokenizer: Any, tokens: list[int]) -> list[str]:
    """Each token's own text, as the tokenizer's vocabulary writes it (vLLM's `token_strs`). Raises nothing."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    convert = getattr(inner, "convert_ids_to_tokens", None)
    if convert is not None:
        return [str(piece) for piece in convert(tokens)]
    return [tokenizer.decode([t]) for t in tokens]
