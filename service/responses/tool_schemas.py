"""The tools a POST /v1/responses body declares: functions (flat, unlike chat's), custom tools of free text
(Codex's apply_patch), namespaces of functions (Codex's MCP servers), and the tools OpenAI runs itself, accepted
and never offered to the model (Codex declares web_search by default)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from service.chat.schemas import TOOL_NAME, FunctionDefinition, _Request, _only_false

__all__ = ["HOSTED_TOOLS", "FunctionTool", "CustomToolFormat", "CustomTool", "NamespaceTool", "HostedTool",
           "ResponseTool"]

# Tools OpenAI runs on its side: accepted (Codex declares web_search by default), never offered to the model.
HOSTED_TOOLS = ("web_search", "web_search_preview", "web_search_2025_08_26", "file_search", "code_interpreter",
                "image_generation", "computer_use_preview", "computer_use", "mcp", "local_shell", "shell",
                "apply_patch", "tool_search")


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
    """A tool OpenAI runs itself (web search, file search, …): accepted, not offered to the model."""

    model_config = ConfigDict(extra="allow")

    type: str


def _tool_kind(tool: Any) -> str | None:
    kind = tool.get("type") if isinstance(tool, dict) else getattr(tool, "type", None)  # parsed: serialized
    tags = {"function": "FunctionTool", "custom": "CustomTool", "namespace": "NamespaceTool"}
    if isinstance(kind, str) and kind in tags:
        return tags[kind]
    return "HostedTool" if kind in HOSTED_TOOLS else None


# Tags in CamelCase: error paths leave them out (service/http/handlers.py), naming `tools.0.strict`.
ResponseTool = Annotated[
    Union[Annotated[FunctionTool, Tag("FunctionTool")], Annotated[CustomTool, Tag("CustomTool")],
          Annotated[NamespaceTool, Tag("NamespaceTool")], Annotated[HostedTool, Tag("HostedTool")]],
    Discriminator(_tool_kind, custom_error_type="invalid_tool_type",
                  custom_error_message="a tool's type must be 'function', 'custom' or 'namespace' (or a hosted "
                                       "tool, which is not offered: " + ", ".join(HOSTED_TOOLS) + ")"),
]
