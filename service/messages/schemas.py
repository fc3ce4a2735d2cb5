"""Pydantic models of a POST /v1/messages body (Anthropic's Messages API, as Claude Code and the anthropic SDKs send
it) and of /v1/messages/count_tokens; service/messages/translate.py turns one into a chat request.

As for chat, every field is honoured or refused with a 400 naming it: unknown top-level fields are refused, nested
objects may carry unknown fields only while they are empty, and blocks this server cannot read (images,
documents, Anthropic's server tools) are refused by name. `cache_control` is accepted anywhere Anthropic takes it:
the prefix cache keeps prefixes whatever a request marks. Values Anthropic refuses are refused here too (a `ttl`
other than 5m or 1h, tools of one name, a `tool_choice` without `tools`), not taken silently.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from service.chat.request_limits import MAX_STOP_STRINGS
from service.chat.schemas import TOOL_NAME, _Body, _Request, unread_parts_refused
from service.chat.schemas import CacheControl as ChatCacheControl

__all__ = ["AnthropicCacheControl", "TextBlock", "ToolUseBlock", "ToolResultBlock", "ThinkingBlock",
           "RedactedThinkingBlock", "MessageTurn", "ToolDefinition", "ToolChoice", "ThinkingConfig", "Metadata",
           "InputTokens", "ToolUses", "ThinkingTurns", "ClearToolUsesEdit", "ClearThinkingEdit", "ContextManagement",
           "JSONOutputFormat", "OutputConfig", "CountTokensRequest", "MessagesRequest"]

# Blocks a text model cannot read, by type: refused with a sentence naming them (a tool's result says it in a line).
UNREAD_BLOCKS = {"image": "images", "document": "documents", "search_result": "search results",
                 "container_upload": "files"}


class AnthropicCacheControl(ChatCacheControl):
    """A prompt-caching breakpoint: accepted (prefixes are cached anyway); `ttl` one of Anthropic's two."""

    ttl: Literal["5m", "1h"] | None = None


CacheControl = AnthropicCacheControl


class TextBlock(_Request):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[Any] | None = Field(None, description="Only null or empty: no citations here.")

    @field_validator("citations")
    @classmethod
    def _no_citations(cls, citations: list[Any] | None) -> list[Any] | None:
        if citations:  # a cited document is not read here, so there is nothing to cite
            raise ValueError("citations are not supported here: send null or an empty list")
        return citations


class ToolUseBlock(_Request):
    """An earlier call of the assistant's: goes back to the template as a tool call."""

    type: Literal["tool_use"]
    id: str = Field(..., min_length=1)
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None


def _tool_result_content(content: Any) -> Any:
    """An image or document a tool returned is told to the model in a line (Claude Code's Read of a picture):
    refusing it would end an agent's session, whose history carries it every turn."""
    if not isinstance(content, list):
        return content
    return [{"type": "text", "text": f"[the tool returned {UNREAD_BLOCKS[b['type']]}: this model reads text only]"}
            if isinstance(b, dict) and b.get("type") in UNREAD_BLOCKS else b for b in content]


class ToolResultBlock(_Request):
    """A tool's result for the call `tool_use_id`: text or text blocks; `is_error` says it failed."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(..., min_length=1)
    content: str | list[TextBlock] | None = None
    is_error: bool | None = Field(None, description="true: the result opens with \"Error:\" for the model.")
    cache_control: CacheControl | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _unread_said(cls, content: Any) -> Any:
        return _tool_result_content(content)

    def text(self) -> str:
        """The result as the model reads it. Raises nothing."""
        text = self.content if isinstance(self.content, str) else "".join(b.text for b in self.content or ())
        return f"Error: {text}" if self.is_error else text


class ThinkingBlock(_Request):
    """Earlier thinking: its text goes back to the template as the turn's reasoning (where the template writes it);
    the signature is not checked."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None
    cache_control: CacheControl | None = None


class RedactedThinkingBlock(_Request):
    """Another server's sealed thinking: unreadable here, left out of the prompt."""

    type: Literal["redacted_thinking"]
    data: str


_BLOCKS = {"text": "TextBlock", "tool_use": "ToolUseBlock", "tool_result": "ToolResultBlock",
           "thinking": "ThinkingBlock", "redacted_thinking": "RedactedThinkingBlock"}


def _block_kind(block: Any) -> str | None:
    kind = block.get("type") if isinstance(block, dict) else None
    return _BLOCKS.get(kind) if isinstance(kind, str) else None


ContentBlock = Annotated[
    Union[Annotated[TextBlock, Tag("TextBlock")], Annotated[ToolUseBlock, Tag("ToolUseBlock")],
          Annotated[ToolResultBlock, Tag("ToolResultBlock")], Annotated[ThinkingBlock, Tag("ThinkingBlock")],
          Annotated[RedactedThinkingBlock, Tag("RedactedThinkingBlock")]],
    Discriminator(_block_kind, custom_error_type="invalid_block_type",
                  custom_error_message="a content block's type must be one of " + ", ".join(map(repr, _BLOCKS))),
]

# Which blocks each role's turn may carry (a system turn mid-conversation: Anthropic's mid-conversation-system beta).
_ROLE_BLOCKS = {"user": (TextBlock, ToolResultBlock), "assistant": (TextBlock, ToolUseBlock, ThinkingBlock,
                                                                   RedactedThinkingBlock), "system": (TextBlock,)}


def _unread_blocks_refused(content: Any) -> Any:
    return unread_parts_refused(content, UNREAD_BLOCKS, "content blocks")


class MessageTurn(_Request):
    role: Literal["user", "assistant", "system"] = Field(
        ..., description="system: an instruction at this point of the conversation (Claude Code sends its agents and "
                         "skills so); the model reads it within the user turn beside it.")
    content: str | list[ContentBlock]

    @field_validator("content", mode="before")
    @classmethod
    def _readable(cls, content: Any) -> Any:
        return _unread_blocks_refused(content)

    @model_validator(mode="after")
    def _blocks_of_the_role(self) -> "MessageTurn":
        # An empty array is judged by its place (translate.py): Anthropic takes one as the final assistant turn.
        if isinstance(self.content, list):
            for i, block in enumerate(self.content):
                if not isinstance(block, _ROLE_BLOCKS[self.role]):
                    raise ValueError(f"content.{i}: a {block.type!r} block cannot be in a {self.role} turn")
        return self


class ToolDefinition(_Request):
    """A tool the model may call (Anthropic's client tool)."""

    name: str = Field(..., pattern=TOOL_NAME)
    description: str | None = None
    input_schema: dict[str, Any] = Field(..., description="A JSON Schema of type \"object\".")
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    strict: bool | None = Field(None, description="true: a call's input follows `input_schema`, enforced token by "
                                                   "token, for models whose calls are <tool_call> JSON (Hermes, Qwen "
                                                   "2.5 and 3, SmolLM3, tools told in the prompt); a 400 for others.")

    @field_validator("input_schema")
    @classmethod
    def _object_schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        if "type" in schema and schema["type"] != "object":  # a tool's input is an object, as Anthropic requires
            raise ValueError(f"type: Input should be 'object', not {schema['type']!r}")
        return schema

    @model_validator(mode="before")
    @classmethod
    def _no_server_tools(cls, value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        if kind not in (None, "custom"):
            raise ValueError(f"type {kind!r}: Anthropic's server tools (web search, bash, text editor, code "
                             "execution, …) are not run here; declare client tools with name and input_schema")
        return value


class ToolChoice(_Request):
    type: Literal["auto", "any", "tool", "none"] = Field(
        ..., description="auto; any: some call, enforced; tool: a call of `name`, enforced (both for models whose "
                         "calls are <tool_call> JSON); none: no call.")
    name: str | None = Field(None, pattern=TOOL_NAME)
    disable_parallel_tool_use: bool | None = Field(None, description="true: the reply ends after its first call.")

    @model_validator(mode="after")
    def _name_with_tool(self) -> "ToolChoice":
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("name: given with type \"tool\", and only then")
        if self.type == "none" and self.disable_parallel_tool_use is not None:  # Anthropic's none has no such field
            raise ValueError("disable_parallel_tool_use: not with type \"none\" (no call is made)")
        return self


class ThinkingConfig(_Request):
    type: Literal["enabled", "disabled", "adaptive"] = Field(
        ..., description="enabled / adaptive: the template's thinking switch on (reasoning_effort low, medium or "
                         "high by budget_tokens for a template that reads an effort); disabled: off.")
    budget_tokens: int | None = Field(None, ge=1024, description="With enabled (required); picks the effort, is "
                                                                 "not enforced: max_tokens bounds the reply.")
    display: Literal["summarized", "omitted"] | None = Field(
        None, description="summarized (the default): thinking blocks carry the thinking; omitted: they come empty.")

    @model_validator(mode="after")
    def _budget_when_enabled(self) -> "ThinkingConfig":
        if self.type == "enabled" and self.budget_tokens is None:
            raise ValueError("budget_tokens: required when thinking is enabled")
        if self.type == "disabled" and self.budget_tokens is not None:
            raise ValueError("budget_tokens: goes with thinking enabled or adaptive, not disabled")
        return self


class Metadata(_Request):
    user_id: str | None = Field(None, max_length=256,
                                description="An end-user id (up to 256 characters, as Anthropic's): written on the "
                                            "request's access-log line.")


class InputTokens(_Request):
    type: Literal["input_tokens"]
    value: int = Field(..., ge=0)


class ToolUses(_Request):
    type: Literal["tool_uses"]
    value: int = Field(..., ge=0)


class ThinkingTurns(_Request):
    type: Literal["thinking_turns"]
    value: int = Field(..., ge=0)


class AllThinkingTurns(_Request):
    type: Literal["all"]


class ClearToolUsesEdit(_Request):
    """Past `trigger`, the results of all tool uses but the last `keep` (and those of `exclude_tools`) are replaced
    by a placeholder, their inputs too where `clear_tool_inputs` says; not at all if that clears fewer prompt
    tokens than `clear_at_least`."""

    type: Literal["clear_tool_uses_20250919"]
    trigger: Annotated[Union[InputTokens, ToolUses], Field(discriminator="type")] = Field(
        default_factory=lambda: InputTokens(type="input_tokens", value=100_000))
    keep: ToolUses = Field(default_factory=lambda: ToolUses(type="tool_uses", value=3))
    clear_at_least: InputTokens | None = None
    exclude_tools: list[str] | None = None
    clear_tool_inputs: bool | list[str] | None = Field(
        None, description="true: the cleared uses' inputs too; a list: those of the tools it names.")


class ClearThinkingEdit(_Request):
    """Thinking blocks of all assistant turns but the last `keep` that have some are left out of the prompt."""

    type: Literal["clear_thinking_20251015"]
    keep: Annotated[Union[ThinkingTurns, AllThinkingTurns], Field(discriminator="type")] | Literal["all"] = Field(
        default_factory=lambda: ThinkingTurns(type="thinking_turns", value=1))


class ContextManagement(_Request):
    """Anthropic's context editing: the edits are applied, in order, to the conversation before it is rendered
    (service/messages/context_edits.py); the reply's `context_management.applied_edits` says what they cleared."""

    edits: list[Annotated[Union[ClearToolUsesEdit, ClearThinkingEdit], Field(discriminator="type")]] | None = Field(
        None, description="At most one edit of each type (each re-renders the prompt to count what it cleared).")

    @field_validator("edits")
    @classmethod
    def _one_of_each(cls, edits: list[Any] | None) -> list[Any] | None:
        types = [edit.type for edit in edits or ()]
        if len(types) != len(set(types)):  # 2,000 copies of one edit rendered the prompt 4,000 times (a probe)
            raise ValueError("at most one edit of each type")
        return edits


class JSONOutputFormat(_Request):
    """Anthropic's structured output: the reply's text is JSON following `schema`, enforced token by token (chat's
    response_format json_schema, strict)."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(..., alias="schema", description="A JSON Schema the reply's text follows.")


class OutputConfig(_Request):
    format: JSONOutputFormat | None = Field(
        None, description="json_schema: the reply's text is JSON following `schema` (the anthropic SDKs' "
                          "messages.parse); not with a prefill.")
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = Field(
        None, description="As `thinking`'s budget does: the effort of a template that reads one (gpt-oss: xhigh and "
                          "max are high), else the thinking switch on; refused by name where `thinking` would be. "
                          "high without `thinking` is Anthropic's default: nothing asked.")


class CountTokensRequest(_Body):
    """POST /v1/messages/count_tokens body: a Messages request's prompt, without the reply's settings."""

    model: str = Field(..., description="The served model's id (GET /v1/models) or an alias given at start.")
    messages: list[MessageTurn] = Field(..., min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    cache_control: CacheControl | None = Field(None, description="Accepted: prefixes are cached anyway.")
    context_management: ContextManagement | None = None
    output_config: OutputConfig | None = None
    output_format: JSONOutputFormat | None = Field(
        None, description="Anthropic's deprecated beta name of `output_config.format`; not beside it.")

    @field_validator("tools")
    @classmethod
    def _unique_names(cls, tools: list[ToolDefinition] | None) -> list[ToolDefinition] | None:
        names = [tool.name for tool in tools or ()]
        if len(names) != len(set(names)):  # which one a call meant could not be told
            raise ValueError("Tool names must be unique.")
        return tools

    @model_validator(mode="after")
    def _choice_with_tools(self) -> "CountTokensRequest":
        if self.tool_choice is not None and self.tools is None:
            raise ValueError("tool_choice: may only be specified while providing tools")
        if self.output_format is not None and self.output_config is not None and self.output_config.format is not None:
            raise ValueError("output_format: deprecated, the same as output_config.format: send only that")
        return self

    def json_format(self) -> JSONOutputFormat | None:
        """The structured output asked, by either name. Raises nothing."""
        return self.output_config.format if self.output_config is not None and self.output_config.format else \
            self.output_format


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages body."""

    max_tokens: int = Field(..., ge=1)
    stream: bool | None = Field(False, description="true: server-sent events, `event: <type>` and `data: <json>`.")
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = Field(
        None, description="Accepted: this server has one tier, standard (the reply's usage.service_tier).")

    @field_validator("stop_sequences")
    @classmethod
    def _few_stops(cls, stops: list[str] | None) -> list[str] | None:
        if stops is not None and len(stops) > MAX_STOP_STRINGS:  # chat's limit: each is matched on every token
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop sequences")
        if stops is not None and "" in stops:  # it would end every reply before its first word
            raise ValueError("a stop sequence cannot be empty")
        return stops
