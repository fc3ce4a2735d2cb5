"""Pydantic models of what /v1/responses answers (OpenAI's Response object and stream events), the OpenAPI source
for its replies; the route builds them as dicts (service/responses/output.py) in these shapes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from service.chat.replies import CACHE_WRITES

__all__ = ["ResponseUsage", "ResponseObject", "ResponseStreamEvent", "DeletedResponse", "ResponseItemList",
           "InputTokens"]


class InputTokensDetails(BaseModel):
    cached_tokens: int = Field(..., description="Prompt tokens whose KV came from the prefix cache.")
    cache_write_tokens: int = Field(..., description=CACHE_WRITES)


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = Field(..., description="The tokens of the thinking's text (its markers not counted).")


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseObject(BaseModel):
    """A model response: `output` holds `reasoning`, `message`, `function_call` and `custom_tool_call` items."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: Literal["completed", "incomplete", "failed", "in_progress"]
    model: str
    output: list[dict[str, Any]]
    parallel_tool_calls: bool
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    instructions: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] = Field(..., description="`format`, and `verbosity` (always medium).")
    truncation: Literal["disabled"] = "disabled"
    store: bool = Field(..., description="Whether the response is kept (for `previous_response_id`).")
    background: Literal[False] = False
    service_tier: str = "default"
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None
    usage: ResponseUsage | None = None


class ResponseStreamEvent(BaseModel):
    """One event (`event: <type>`, `data: <this>`): lifecycle events carry `response`; item events `item` and
    `output_index`; text events `item_id`, `output_index`, `content_index` (`summary_index`) and `delta` or the
    whole `text`/`arguments`/`input` (`response.function_call_arguments.done` the function's `name` too)."""

    type: str
    sequence_number: int
    response: ResponseObject | None = None
    output_index: int | None = None
    item: dict[str, Any] | None = None
    item_id: str | None = None
    content_index: int | None = None
    summary_index: int | None = None
    part: dict[str, Any] | None = None
    delta: str | None = None
    text: str | None = None
    arguments: str | None = None
    name: str | None = None
    input: str | None = None
    logprobs: list[Any] | None = None


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: Literal[True] = True


class ResponseItemList(BaseModel):
    """A page of a response's input items (OpenAI's ResponseItemList): `data` in the order asked, each item with its
    `id`; `first_id` and `last_id` null for an empty page."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


class InputTokens(BaseModel):
    """POST /v1/responses/input_tokens' answer: the prompt's tokens, as /v1/responses would render it."""

    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int
