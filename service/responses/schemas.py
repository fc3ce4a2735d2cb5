"""Pydantic models of a POST /v1/responses body (OpenAI's Responses API), as the openai SDK, the openai-agents SDK
and Codex send it; service/responses/history.py turns one into a chat request.

As for chat, every field is honoured or refused with a 400 naming it. Two kinds of leniency, both on purpose:
input items (the client's copy of earlier output) may carry keys this server does not read — `id`, `status`,
Codex's `phase` — since they describe what was said and ask for nothing; the OpenAI tools Codex declares
(`web_search` by default, …) are accepted and not offered to the model (service/responses/tool_schemas.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from service.chat.cache_retention import CacheRetention, retention_alias
from service.chat.json_output import check_response_format
from service.chat.structured_outputs import StructuredOutputs
from service.chat.metadata import metadata_limits
from service.chat.schemas import (TOOL_NAME, UNREAD_PARTS, _Body, _Request, _empty, _only_false,
                                  no_forced_call, unread_parts_refused)
from service.chat.tool_results import returned_parts_said
from service.responses.sampling import EFFORTS, ResponsesSampling
from service.responses.tool_schemas import (UNOFFERED_TOOLS, CustomTool, FunctionTool, HostedTool, NamespaceTool,
                                            ResponseTool, hosted_choice_refused)
from service.responses.unoffered import context_management_offered, truncation_offered, verbosity_offered

__all__ = ["TextInput", "InputMessage", "ItemReference", "FunctionCallItem", "FunctionCallOutput", "CustomToolCallItem",
           "CustomToolCallOutput", "ReasoningItem", "InputItem", "FunctionTool", "CustomTool", "NamespaceTool",
           "HostedTool", "ResponseTool", "Reasoning", "TextConfig", "ResponsesPrompt", "ResponsesRequest",
           "InputTokensRequest", "UNOFFERED_TOOLS", "TEXT_LOGPROBS"]

class _Item(BaseModel):
    """An input item or one of its parts: earlier output echoed back; keys it carries beyond these are read as
    description (ids, statuses), not as requests."""

    model_config = ConfigDict(extra="ignore", strict=True)


class _Listed(_Item):
    """An item kept with its response: `id` is what GET /v1/responses/{id}/input_items lists it by (the client's,
    else one given it there: service/responses/input_list.py); a non-string id is read as none, as a label."""

    id: str | None = None

    @field_validator("id", mode="before")
    @classmethod
    def _label(cls, value: Any) -> Any:
        return value if isinstance(value, str) else None


class TextInput(_Item):
    """A text part: `input_text` (user, system, developer), `output_text` (an earlier assistant reply)."""

    type: Literal["input_text", "output_text", "text"]
    text: str


class RefusalInput(_Item):
    type: Literal["refusal"]
    refusal: str


def _part_kind(part: Any) -> str | None:
    # a parsed part too: serializing a request (a kept response's items) picks its member by the same function
    kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
    if kind in UNREAD_PARTS:
        return None  # refused by unread_parts_refused with a sentence
    return "RefusalInput" if kind == "refusal" else "TextInput"


InputPart = Annotated[
    Union[Annotated[TextInput, Tag("TextInput")], Annotated[RefusalInput, Tag("RefusalInput")]],
    Discriminator(_part_kind, custom_error_type="invalid_part_type",
                  custom_error_message="a content part's type must be 'input_text' (or 'output_text', 'refusal')"),
]


def part_text(content: str | list[Any]) -> str:
    """Text parts joined (refusals by their text). Raises nothing."""
    if isinstance(content, str):
        return content
    return "".join(p.text if isinstance(p, TextInput) else p.refusal for p in content)


class InputMessage(_Listed):
    """A message; `type` may be left out (the SDK's "easy" input message). `developer` is a system turn."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputPart]

    @field_validator("content", mode="before")
    @classmethod
    def _readable_parts(cls, content: Any) -> Any:
        return unread_parts_refused(content)


class FunctionCallItem(_Listed):
    """An earlier function call of the model's (`namespace`: the namespace tool it came from)."""

    type: Literal["function_call"]
    call_id: str = Field(..., min_length=1)
    name: str
    arguments: str
    namespace: str | None = None
    status: str | None = Field(None, description="incomplete, with no output: a cut call, left out of the prompt.")


class _ToolOutput(_Listed):
    """A tool's result for `call_id`: text, or text parts. An image or file a tool returned (Codex's view_image) is
    told to the model in a line: refusing it would stop an agent's session, whose history carries it every turn."""

    call_id: str = Field(..., min_length=1)
    output: str | list[InputPart]

    @field_validator("output", mode="before")
    @classmethod
    def _unread_parts_said(cls, output: Any) -> Any:
        return returned_parts_said(output, "input_text")


class FunctionCallOutput(_ToolOutput):
    type: Literal["function_call_output"]


class CustomToolCallItem(_Listed):
    """An earlier call of a custom (free-form input) tool."""

    type: Literal["custom_tool_call"]
    call_id: str = Field(..., min_length=1)
    name: str
    input: str
    status: str | None = Field(None, description="As a function_call's.")


class CustomToolCallOutput(_ToolOutput):
    type: Literal["custom_tool_call_output"]


class SummaryText(_Item):
    type: Literal["summary_text"]
    text: str


class ReasoningText(_Item):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(_Listed):
    """Earlier thinking: its text goes back to the chat template beside the next assistant turn. This server's own
    `encrypted_content` is that text (with a prefix); another server's is unreadable and left out."""

    type: Literal["reasoning"]
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None


class ItemReference(_Item):
    """An item of an earlier response, by id: resolved from the items this server issued lately
    (service/responses/item_cache.py)."""

    type: Literal["item_reference"]
    id: str


_ITEMS = {"message": "InputMessage", "function_call": "FunctionCallItem",
          "function_call_output": "FunctionCallOutput", "custom_tool_call": "CustomToolCallItem",
          "custom_tool_call_output": "CustomToolCallOutput", "reasoning": "ReasoningItem",
          "item_reference": "ItemReference"}


def _item_kind(item: Any) -> str | None:
    # the SDK's easy message has no type; a parsed item (serialized) has its own
    kind = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", None)
    return _ITEMS.get(kind) if isinstance(kind, str) else None


InputItem = Annotated[
    Union[
        Annotated[InputMessage, Tag("InputMessage")],
        Annotated[FunctionCallItem, Tag("FunctionCallItem")],
        Annotated[FunctionCallOutput, Tag("FunctionCallOutput")],
        Annotated[CustomToolCallItem, Tag("CustomToolCallItem")],
        Annotated[CustomToolCallOutput, Tag("CustomToolCallOutput")],
        Annotated[ReasoningItem, Tag("ReasoningItem")],
        Annotated[ItemReference, Tag("ItemReference")],
    ],
    Discriminator(_item_kind, custom_error_type="invalid_item_type",
                  custom_error_message="an input item's type must be one of " + ", ".join(map(repr, _ITEMS))),
]


class Reasoning(_Request):
    effort: EFFORTS | None = Field(
        None, description='As chat\'s reasoning_effort ("none" switches thinking off).')
    summary: Literal["auto", "concise", "detailed", "none"] | None = Field(
        None, description='The thinking is given as the reasoning item\'s `summary` (no shorter summary is '
                          'written); with "none" in its `content`.')
    generate_summary: Literal["auto", "concise", "detailed", "none"] | None = Field(None, description="As summary.")


class TextFormat(_Request):
    type: Literal["text", "json_object", "json_schema"] = Field(
        ..., description="json_schema: the reply follows `schema`, enforced token by token (after a thinking "
                         "block); json_object: any JSON object; beside tools a call may come instead.")
    name: str | None = Field(None, description="json_schema: the schema's name (required).")
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="json_schema: the JSON Schema.")
    strict: bool | None = Field(None, description="Either way the schema is enforced.")
    description: str | None = None

    @model_validator(mode="after")
    def _chat_rules(self) -> "TextFormat":
        check_response_format(self.chat_format())
        return self

    def chat_format(self) -> dict[str, Any]:
        """Chat's response_format for this format. Raises nothing."""
        if self.type != "json_schema":
            return {"type": self.type}
        spec = {"name": self.name, "schema": self.schema_, "strict": self.strict, "description": self.description}
        return {"type": "json_schema", "json_schema": {k: v for k, v in spec.items() if v is not None}}


class TextConfig(_Request):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = Field(None, description="Only medium (the response says it): replies are "
                                                                  "as long as the model makes them.")

    _verbosity = field_validator("verbosity", mode="before")(verbosity_offered)


class ResponsesToolChoice(_Request):
    """A call of this function, forced."""

    type: Literal["function"]
    name: str = Field(..., pattern=TOOL_NAME)


class ResponsesStreamOptions(_Request):
    include_obfuscation: bool | None = Field(None, description="Only false: events are not padded.")

    @field_validator("include_obfuscation")
    @classmethod
    def _no_obfuscation(cls, value: bool | None) -> bool | None:
        return _only_false(value, "events are never padded here: only false is supported")


# `include` values this server can honour.
TEXT_LOGPROBS = "message.output_text.logprobs"
INCLUDABLE = ("reasoning.encrypted_content", TEXT_LOGPROBS)


class ResponsesPrompt(_Body):
    """The fields of a Responses body that make its prompt: what POST /v1/responses/input_tokens counts."""

    model: str | None = Field(None, description="Model id from GET /v1/models; omitted means the loaded model.")
    instructions: str | None = Field(None, description="A system message before the input.")
    tools: list[ResponseTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | ResponsesToolChoice | None = Field(
        None, description='"auto", "none", or a forced call ("required", or a named function: as chat\'s).')
    parallel_tool_calls: bool | None = Field(None, description="false: the reply ends after its first tool call.")
    reasoning: Reasoning | None = None
    text: TextConfig | None = None
    truncation: Literal["disabled"] | None = Field(None, description="Only disabled: a conversation longer than the "
                                                                     "context is refused, never cut.")
    previous_response_id: str | None = Field(None, description="A response kept here (see `store`): its "
                                                               "conversation, then `input`. Its instructions and "
                                                               "tools are not carried over (as OpenAI's).")
    # What needs stored state this server does not have: only null (or empty) passes.
    conversation: str | dict[str, Any] | None = Field(None, description="Only null: this server keeps no "
                                                                        "conversations.")

    @field_validator("conversation")
    @classmethod
    def _no_conversation(cls, value: Any) -> Any:
        if not _empty(value):
            raise ValueError("not supported by this server (only null) (no conversations are kept here: send the "
                             "items, or previous_response_id)")
        return value

    @field_validator("input", check_fields=False)  # each body declares its own `input`
    @classmethod
    def _says_something(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("an empty array; give at least one item")
        return value

    _no_forced_call = field_validator("tool_choice", mode="before")(no_forced_call)
    _hosted_choice = field_validator("tool_choice", mode="before")(hosted_choice_refused)
    _truncation = field_validator("truncation", mode="before")(truncation_offered)


class ResponsesRequest(ResponsesSampling, ResponsesPrompt):
    """POST /v1/responses body."""

    # vLLM's Responses body takes it (not the guided_* spellings): the reply's text follows it, as chat's does.
    structured_outputs: StructuredOutputs | None = Field(
        None, description="vLLM's: one of choice, regex, json, grammar or json_object constrains the reply's text (not "
                          "beside a text.format that is not text).")

    input: str | list[InputItem] = Field(..., description="A user message, or the conversation's items (all of "
                                                          "them, or those after `previous_response_id`).")
    stream: bool | None = Field(False, description="true: server-sent events, `event: <type>` and `data: <json>`.")
    stream_options: ResponsesStreamOptions | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    include: list[str] | None = Field(None, description="reasoning.encrypted_content: the reasoning item's "
                                                        "`encrypted_content` carries the thinking, to be sent back; "
                                                        "message.output_text.logprobs: each output_text part, and "
                                                        "each of its streamed deltas, carries its tokens' `logprobs`.")
    store: bool | None = Field(None, description="true or null: the response is kept in memory a while (per API "
                                                 "key, 16 MiB of responses and items, not across restarts) for "
                                                 "`previous_response_id`; false: it is not.")
    metadata: dict[str, str] | None = Field(None, description="Tags, as chat's (at most 16 pairs, keys of at most 64 "
                                                              "characters, values of at most 512): echoed on the "
                                                              "response and written on the request's access-log line.")
    client_metadata: dict[str, str] | None = Field(None, description="Codex's tags: accepted, kept nowhere.")
    prompt_cache_key: str | None = Field(None, description="Which cached prefix to continue (a hint).")
    prompt_cache_retention: CacheRetention | None = Field(
        None, description="Accepted (\"in-memory\" as \"in_memory\") and echoed: cached prefixes stay in memory "
                          "while the memory budget has room for them.")
    service_tier: Literal["auto", "default"] | None = Field(None, description="This server has one tier.")
    context_management: list[dict[str, Any]] | None = Field(
        None, description="Only none or []: compaction is not offered (a conversation longer than the context is "
                          "refused, never compacted).")
    user: str | None = Field(None, description="An end-user id: written on the request's access-log line.")
    safety_identifier: str | None = Field(None, description="As `user`.")
    background: bool | None = Field(None, description="Only false: responses are not run in the background.")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="With include message.output_text.logprobs: "
                                                                    "the likeliest tokens given beside each "
                                                                    "(`top_logprobs`); without it nothing is given, "
                                                                    "as at OpenAI.")
    prompt: dict[str, Any] | None = Field(None, description="Only null: no stored prompts.")
    max_tool_calls: int | None = Field(None, ge=0, description="The most tool calls the reply makes: it ends with "
                                                               "the call that reaches it; 0 offers no tool (as "
                                                               "tool_choice none; a forced call beside it is a 400).")

    @field_validator("prompt")
    @classmethod
    def _no_prompt(cls, value: Any) -> Any:
        if not _empty(value):
            raise ValueError("not supported by this server (only null)")
        return value

    @field_validator("include")
    @classmethod
    def _includable(cls, value: list[str] | None) -> list[str] | None:
        for entry in value or ():
            if entry not in INCLUDABLE:
                raise ValueError(f"{entry!r} cannot be included here; only " + ", ".join(INCLUDABLE))
        return value

    _context_management = field_validator("context_management")(context_management_offered)
    _retention = field_validator("prompt_cache_retention", mode="before")(retention_alias)

    @field_validator("background")
    @classmethod
    def _not_in_background(cls, value: bool | None) -> bool | None:
        return _only_false(value, "responses are not run in the background here: only false is supported")

    _metadata = field_validator("metadata")(metadata_limits)


class InputTokensRequest(ResponsesPrompt):
    """POST /v1/responses/input_tokens body (openai-node's `responses.inputTokens.count`): the prompt a
    /v1/responses body with these fields would have."""

    input: str | list[InputItem] | None = Field(None, description="A user message, or the conversation's items "
                                                                  "(those after `previous_response_id`, if given).")

    def as_request(self) -> ResponsesRequest:
        """The /v1/responses body of these fields (validated here; none other set). Raises nothing."""
        fields = {name: getattr(self, name) for name in self.model_fields_set}
        return ResponsesRequest.model_construct(**{**fields, "input": [] if self.input is None else self.input})
