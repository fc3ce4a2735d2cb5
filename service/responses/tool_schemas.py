"""The tools a POST /v1/responses body declares: functions (flat, unlike chat's), custom tools of free text
(Codex's apply_patch), namespaces of functions (Codex's MCP servers), and the tools OpenAI runs itself (or asks its
client to: `local_shell`, …). Of those, what Codex CLI declares is accepted and not offered to the model (it sends
web_search by default, local_shell and tool_search with some models and settings); the others could never be used
here, so each is a 400 naming it, as is forcing any of them."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from service.chat.schemas import TOOL_NAME, FunctionDefinition, _Request, _only_false

__all__ = ["UNOFFERED_TOOLS", "REFUSED_TOOLS", "FunctionTool", "CustomToolFormat", "CustomTool", "NamespaceTool",
           "HostedTool", "ResponseTool", "hosted_choice_refused"]

# Accepted, never offered to the model (and left out of the Response's `tools`): Codex declares web_search by
# default (unless `web_search = "disabled"`), local_shell for its codex-mini models, tool_search beside deferred
# MCP tools; shell and apply_patch are the same kind of client-run tool.
UNOFFERED_TOOLS = ("web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11",
                   "local_shell", "shell", "apply_patch", "tool_search")
# What each refused tool would have done, for the 400 that names it: no client declares these unasked.
REFUSED_TOOLS = {"file_search": "searches OpenAI's vector stores", "code_interpreter": "runs code in OpenAI's "
                 "containers", "image_generation": "draws with OpenAI's image model", "computer_use_preview": "needs "
                 "OpenAI's computer-use model", "computer_use": "needs OpenAI's computer-use model",
                 "mcp": "calls a remote MCP server from OpenAI's side"}


class FunctionTool(FunctionDefinition):
    """A function the model may call (flat, unlike chat's `{"function": {...}}`)."""

    type: Literal["function"]
    defer_loading: bool | None = Field(None, description="Only false or null: every tool is shown at once.")

    @field_validator("defer_loading")
    @classmethod
    def _shown(cls, value: bool | None) -> bool | None:
        return _only_false(value, "tools are not loaded on demand here: only false is supported")


class CustomToolFormat(_Request):
    """A custom tool's input format: free text, or a grammar (Codex's apply_patch declares a Lark one)."""

    type: Literal["text", "grammar"]
    syntax: Literal["lark", "regex"] | None = None
    definition: str | None = None


class CustomTool(_Request):
    """A tool whose input is free text (Codex's apply_patch): offered to the model as a function of one string,
    `input`, with its grammar, if any, written into the description (the input is not constrained to it: the
    tool checks what it is given); its calls come back as `custom_tool_call` items."""

    type: Literal["custom"]
    name: str = Field(..., pattern=TOOL_NAME)
    description: str | None = None
    format: CustomToolFormat | None = Field(None, description="A grammar is shown to the model, not enforced.")


class NamespaceTool(_Request):
    """A group of functions (Codex's MCP servers): offered as `namespace + name`, called back with `namespace`."""

    type: Literal["namespace"]
    name: str
    description: str | None = None
    tools: list[FunctionTool]


class HostedTool(BaseModel):
    """A tool of UNOFFERED_TOOLS: accepted, not offered to the model."""

    model_config = ConfigDict(extra="allow")

    type: str


class RefusedTool(BaseModel):
    """One of OpenAI's tools that could never be used here: refused (a 400 naming it)."""

    type: str = Field(..., description="Any of " + ", ".join(REFUSED_TOOLS) + ": refused.")

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        raise ValueError(f"{kind!r} is one of OpenAI's own tools (it {REFUSED_TOOLS.get(str(kind), 'runs there')}), "
                         "and none runs here: the model could never use it; declare a function your code runs "
                         "instead, or leave it out")


def _tool_kind(tool: Any) -> str | None:
    kind = tool.get("type") if isinstance(tool, dict) else getattr(tool, "type", None)  # parsed: serialized
    tags = {"function": "FunctionTool", "custom": "CustomTool", "namespace": "NamespaceTool"}
    if isinstance(kind, str) and kind in tags:
        return tags[kind]
    return "HostedTool" if kind in UNOFFERED_TOOLS else "RefusedTool" if kind in REFUSED_TOOLS else None


# Tags in CamelCase: error paths leave them out (service/http/handlers.py), naming `tools.0.strict`.
ResponseTool = Annotated[
    Union[Annotated[FunctionTool, Tag("FunctionTool")], Annotated[CustomTool, Tag("CustomTool")],
          Annotated[NamespaceTool, Tag("NamespaceTool")], Annotated[HostedTool, Tag("HostedTool")],
          Annotated[RefusedTool, Tag("RefusedTool")]],
    Discriminator(_tool_kind, custom_error_type="invalid_tool_type",
                  custom_error_message="a tool's type must be 'function', 'custom' or 'namespace' (or one of "
                                       "OpenAI's, which is not offered: " + ", ".join(UNOFFERED_TOOLS) + ")"),
]


def hosted_choice_refused(cls: Any, value: Any) -> Any:
    """A `tool_choice` validator (before parsing): a forced call of a tool not offered to the model (OpenAI's
    `{"type": "web_search_preview"}`, `{"type": "mcp", "server_label"}`, …) refused in a sentence, not pydantic's
    "tool_choice.name: Field required". Raises ValueError."""
    kind = value.get("type") if isinstance(value, dict) else None
    if isinstance(kind, str) and (kind in REFUSED_TOOLS or kind in UNOFFERED_TOOLS or kind.startswith("web_search")):
        raise ValueError(f"{kind!r} cannot be forced: it is one of OpenAI's own tools, and none is offered to the "
                         "model here; force a function (`{\"type\": \"function\", \"name\": ...}`) or send "
                         "\"auto\"")
    return value
