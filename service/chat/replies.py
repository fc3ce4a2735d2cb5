"""Pydantic models of chat and text completion replies (OpenAI's shapes): the non-streamed bodies, the streamed
chunks, usage and log probabilities. The request bodies are service/chat/schemas.py."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

__all__ = [
    "TopLogprob",
    "LogprobEntry",
    "ChoiceLogprobs",
    "CompletionLogprobs",
    "PromptTokensDetails",
    "CACHE_WRITES",
    "Usage",
    "FunctionCallDelta",
    "ToolCallDelta",
    "ChoiceDelta",
    "MessageFunctionCall",
    "MessageToolCall",
    "ChunkChoice",
    "ChatCompletionChunk",
    "AssistantMessage",
    "ChatChoice",
    "ChatCompletion",
    "CompletionChoice",
    "Completion",
    "FinishReason",
]


def _omit_none(value: object) -> bool:
    return value is None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class LogprobEntry(BaseModel):
    """One sampled token: its text, log probability (raw logits, before sampling settings), UTF-8 bytes and the
    likeliest tokens at its position."""

    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[LogprobEntry] | None = None
    refusal: list[LogprobEntry] | None = None


class CompletionLogprobs(BaseModel):
    """A text completion's legacy log probabilities: parallel lists, one entry per token (an echoed prompt's first
    token has null ones: nothing comes before it)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


# What every API's usage says of the prompt's writes into the prefix cache (the engine's Delta.cache_write_tokens).
CACHE_WRITES = ("Prompt tokens whose KV this request newly stored in the prefix cache (0 where the cache held them "
                "already, read from there or not, or the server keeps none).")


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(0, description="Prompt tokens whose KV came from the prefix cache.")
    cache_write_tokens: int = Field(0, description=CACHE_WRITES)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class FunctionCallDelta(BaseModel):
    name: str | None = Field(None, exclude_if=_omit_none)
    arguments: str | None = Field(None, exclude_if=_omit_none)


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = Field(None, exclude_if=_omit_none)
    type: Literal["function"] | None = Field(None, exclude_if=_omit_none)
    function: FunctionCallDelta | None = Field(None, exclude_if=_omit_none)


class ChoiceDelta(BaseModel):
    role: Literal["assistant"] | None = Field(None, exclude_if=_omit_none)
    content: str | None = Field(None, exclude_if=_omit_none)
    reasoning_content: str | None = Field(None, exclude_if=_omit_none)
    tool_calls: list[ToolCallDelta] | None = Field(None, exclude_if=_omit_none)
    # The legacy shape of a call (a request with `functions`): its name first, then its arguments' fragments.
    function_call: FunctionCallDelta | None = Field(None, exclude_if=_omit_none)


# function_call: the legacy shape's tool_calls.
FinishReason = Literal["stop", "length", "tool_calls", "function_call"]


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChoiceDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    """One SSE `data:` event of a streamed chat completion; the usage chunk has `choices: []`."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str | None = Field(None, exclude_if=_omit_none)
    choices: list[ChunkChoice]
    usage: Usage | None = Field(None, exclude_if=_omit_none)


class MessageFunctionCall(BaseModel):
    name: str
    arguments: str


class MessageToolCall(BaseModel):
    """A whole tool call of a non-streamed reply (OpenAI's ChatCompletionMessageToolCall): no `index`, which only
    streamed deltas carry; the request's ToolCall keeps one for messages the SDK's stream helper assembled."""

    id: str
    type: Literal["function"] = "function"
    function: MessageFunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = Field(None, exclude_if=_omit_none)
    tool_calls: list[MessageToolCall] | None = Field(None, exclude_if=_omit_none)
    function_call: MessageFunctionCall | None = Field(None, exclude_if=_omit_none, description="The call, in OpenAI's "
                                                      "legacy shape: a request with `functions` gets it, not "
                                                      "tool_calls.")


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason


class ChatCompletion(BaseModel):
    """Non-streamed chat completion (with `stream: true` the body is SSE of ChatCompletionChunk)."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None = None


class Completion(BaseModel):
    """Text completion, or (streamed) one SSE event of it."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = Field(None, exclude_if=_omit_none)
