"""Pydantic models of what /v1/messages answers (Anthropic's Message, its stream events, a token count), the
OpenAPI source for its replies; the route builds them as dicts (service/messages/output.py) in these shapes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = ["MessageUsage", "MessageObject", "MessageStreamEvent", "TokenCount", "AnthropicError"]


class MessageUsage(BaseModel):
    input_tokens: int = Field(..., description="Prompt tokens not read from the prefix cache.")
    cache_creation_input_tokens: int = Field(0, description="Always 0: prefixes are cached without being asked.")
    cache_read_input_tokens: int = Field(0, description="Prompt tokens whose KV came from the prefix cache.")
    output_tokens: int


class MessageObject(BaseModel):
    """A reply: `content` holds `thinking`, `text` and `tool_use` blocks, in the order the model wrote them."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[dict[str, Any]]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None
    stop_sequence: str | None = None
    usage: MessageUsage


class MessageStreamEvent(BaseModel):
    """One event (`event: <type>`, `data: <this>`): message_start carries `message`; content_block_start `index`
    and `content_block`; content_block_delta `index` and `delta` (text_delta, thinking_delta, input_json_delta);
    content_block_stop `index`; message_delta `delta` (stop_reason, stop_sequence) and `usage`; ping, message_stop
    nothing; error `error`."""

    type: str
    message: MessageObject | None = None
    index: int | None = None
    content_block: dict[str, Any] | None = None
    delta: dict[str, Any] | None = None
    usage: MessageUsage | None = None
    error: dict[str, Any] | None = None


class TokenCount(BaseModel):
    input_tokens: int = Field(..., description="The tokens of the prompt the chat template renders.")


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    type: Literal["error"] = "error"
    error: AnthropicErrorDetail
