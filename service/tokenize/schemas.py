"""Bodies and answers of the tokenizer routes, as vLLM's OpenAI server words them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from service.chat.schemas import ChatMessage, Tool, _Body

__all__ = ["TokenizeRequest", "TokenizeResponse", "DetokenizeRequest", "DetokenizeResponse", "TokenizerInfo"]


class TokenizeRequest(_Body):
    """Text (`prompt`) or a conversation (`messages`, rendered by the chat template as a chat request would be)."""

    model: str | None = Field(None, description="Model id from GET /v1/models; omitted means the loaded model.")
    prompt: str | None = Field(None, description="Text to tokenize (give it or messages).")
    messages: list[ChatMessage] | None = Field(None, min_length=1, description="A conversation to render and tokenize.")
    tools: list[Tool] | None = Field(None, description="Tools the template is given (with messages).")
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="Template variables (with messages).")
    add_generation_prompt: bool = Field(True, description="With messages: only true (the prompt opens the reply, as a "
                                                          "chat request's does).")
    add_special_tokens: bool | None = Field(None, description="With prompt: the tokenizer's BOS and the like (default "
                                                              "true, as vLLM's); with messages only false.")
    return_token_strs: bool | None = Field(False, description="Also give each token's text.")

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        if self.messages is None and (self.tools is not None or self.chat_template_kwargs is not None):
            raise ValueError("tools and chat_template_kwargs go with messages")
        if self.messages is not None and self.add_special_tokens:
            raise ValueError("add_special_tokens: the chat template writes the special tokens of a conversation")
        if self.messages is not None and not self.add_generation_prompt:
            raise ValueError("add_generation_prompt: only true is supported (the prompt a chat request sends)")
        return self


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
