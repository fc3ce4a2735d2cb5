"""Pydantic models of what /v1/messages answers (Anthropic's Message, its stream events, a token count), the
OpenAPI source for its replies; the route builds them as dicts (service/messages/output.py) in these shapes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = ["MessageUsage", "AppliedEdit", "ContextManagementReply", "MessageObject", "MessageStreamEvent",
           "OriginalTokens", "TokenCount", "AnthropicError"]


class MessageUsage(BaseModel):
    input_tokens: int = Field(..., description="Prompt tokens not read from the prefix cache.")
    cache_creation_input_tokens: int = Field(0, description=(
        "Always 0: the prompt tokens stored in the prefix cache are known only once the reply ends, after "
        "message_start has split the input (they count in input_tokens); /v1/responses and chat report them."))
    cache_read_input_tokens: int = Field(0, description="Prompt tokens whose KV came from the prefix cache.")
    output_tokens: int
    service_tier: Literal["standard"] | None = Field(
        None, description="On the Message: this server's one tier (not on message_delta, as Anthropic's).")


class AppliedEdit(BaseModel):
    type: Literal["clear_tool_uses_20250919", "clear_thinking_20251015"]
    cleared_input_tokens: int = Field(..., description="Prompt tokens the edit cleared (rendered before and after).")
    cleared_tool_uses: int | None = Field(None, description="clear_tool_uses: the tool uses cleared.")
    cleared_thinking_turns: int | None = Field(None, description="clear_thinking: the turns whose thinking went.")


class ContextManagementReply(BaseModel):
    applied_edits: list[AppliedEdit]


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
    context_management: ContextManagementReply | None = Field(
        None, description="With a request's context_management: the edits applied (in a stream, on message_delta).")


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
    context_management: ContextManagementReply | None = None
    error: dict[str, Any] | None = None


class OriginalTokens(BaseModel):
    original_input_tokens: int = Field(..., description="The prompt's tokens before the context edits.")


class TokenCount(BaseModel):
    input_tokens: int = Field(..., description="The tokens of the prompt the chat template renders (context "
                                               "edits applied).")
    context_management: OriginalTokens | None = Field(None, description="With a request's context_management.")


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    type: Literal["error"] = "error"
    error: AnthropicErrorDetail
