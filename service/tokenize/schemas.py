"""Bodies and answers of the tokenizer routes, as vLLM's OpenAI server words them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from service.chat.schemas import ChatMessage, Tool, _Body

__all__ = ["TokenizeRequest", "TokenizeResponse", "DetokenizeRequest", "DetokenizeResponse", "TokenizerInfo"]


class TokenizeRequest(_Body):
    """Text (`prompt`) or a conversation (`messages`, rendered by the chat template as a chat request would be)."""

    model: str | None = Field(None, description="Model id from GET /v1/models; omitted means the loaded model.")
    prompt: str | None = Field(None, description="Text to tokenize (give it or messages).")
    messages: list[ChatMessage] | None = Field(None, min_length=1, validate_default=True,  # neither given: refused
                                               description="A conversation to render and tokenize.")
    tools: list[Tool] | None = Field(None, description="Tools the template is given (with messages).")
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="Template variables (with messages).")
    add_generation_prompt: bool = Field(True, description="With messages: only true (the prompt opens the reply, as a "
                                                          "chat request's does).")
    add_special_tokens: bool | None = Field(None, description="With prompt: the tokenizer's BOS and the like (default "
                                                              "true, as vLLM's); with messages only false.")
    return_token_strs: bool | None = Field(False, description="Also give each token's text.")

    # Field validators, not one model validator: an error raised there names no field (`param: null`). Each runs
    # after the fields it reads (declaration order); one left out when a field it reads failed on its own.
    @field_validator("messages")
    @classmethod
    def _one_input(cls, messages: list[ChatMessage] | None, info: ValidationInfo) -> list[ChatMessage] | None:
        if "prompt" in info.data and (info.data["prompt"] is None) == (messages is None):
            raise ValueError("give either prompt or messages")
        return messages

    @field_validator("tools", "chat_template_kwargs")
    @classmethod
    def _with_messages(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and info.data.get("prompt") is not None:
            raise ValueError("tools and chat_template_kwargs go with messages")
        return value

    @field_validator("add_generation_prompt")
    @classmethod
    def _opens_the_reply(cls, value: bool, info: ValidationInfo) -> bool:
        if not value and info.data.get("messages") is not None:
            raise ValueError("only true is supported (the prompt a chat request sends)")
        return value

    @field_validator("add_special_tokens")
    @classmethod
    def _template_writes_them(cls, value: bool | None, info: ValidationInfo) -> bool | None:
        if value and info.data.get("messages") is not None:
            raise ValueError("the chat template writes the special tokens of a conversation")
        return value


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int | None
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Body):
    model: str | None = Field(None, description="Model id from GET /v1/models; omitted means the loaded model.")
    tokens: list[int] = Field(..., description="Token ids to turn back into text.")


class DetokenizeResponse(BaseModel):
    prompt: str


class TokenizerInfo(BaseModel):
    """What a client needs to tokenize as the server does: its special tokens and chat template."""

    tokenizer_class: str
    model_max_length: int | None
    vocab_size: int | None
    bos_token: str | None
    eos_token: str | None
    pad_token: str | None
    unk_token: str | None
    chat_template: str | None
