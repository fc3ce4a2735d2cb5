"""Pydantic models of the tools a chat request declares and calls: function definitions, the calls in a history
(`tool_calls`, the legacy `function_call`), a forced choice, and OpenAI's rule for a tool's name."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo

from service.chat.strict_body import _Request

__all__ = ["TOOL_NAME", "FunctionCall", "ToolCall", "FunctionDefinition", "ChosenFunction", "NamedToolChoice", "Tool",
           "no_forced_call", "choice_needs_tools", "functions_not_beside_tools", "function_call_chosen"]


def no_forced_call(cls: Any, value: Any) -> Any:
    """A `tool_choice` validator: allowed_tools refused in a sentence, not pydantic's union of alternatives. Raises
    ValueError."""
    if isinstance(value, dict) and value.get("type") == "allowed_tools":
        raise ValueError("allowed_tools is not supported: every declared tool is offered; declare only the tools "
                         "allowed, with \"auto\"")
    return value


# OpenAI's rule for tool names (a name it would refuse could not be sent on to it either).
TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"



class FunctionCall(_Request):
    name: str
    # OpenAI sends a JSON string; some clients send the object itself.
    arguments: str | dict[str, Any] = ""


class ToolCall(_Request):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall
    # The openai SDK's stream helper leaves each streamed call's `index` on the message it assembles, and
    # clients send that message back as it is; the calls' order in the list is what counts.
    index: int | None = None


class FunctionDefinition(_Request):
    name: str = Field(..., pattern=TOOL_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = Field(None, description="true: a call's arguments follow `parameters`, enforced token by "
                                                   "token, for models whose calls are <tool_call> JSON (Hermes, Qwen "
                                                   "2.5 and 3, SmolLM3, tools told in the prompt); a 400 for others.")


class ChosenFunction(_Request):
    name: str = Field(..., pattern=TOOL_NAME)


class NamedToolChoice(_Request):
    """A call of this function, forced."""

    # Optional, as vLLM and TGI take it: huggingface_hub's InferenceClient sends {"function": {"name": ...}} alone.
    type: Literal["function"] = "function"
    function: ChosenFunction


class Tool(_Request):
    type: Literal["function"] = "function"
    function: FunctionDefinition


def choice_needs_tools(cls: Any, value: Any, info: ValidationInfo) -> Any:
    """A `tool_choice` / `parallel_tool_calls` validator: refused without tools, as OpenAI refuses them (`tools: []`
    counts: pi sends it beside an agent's history); a tool_choice beside functions chooses among them. Raises
    ValueError."""
    tools = info.data.get("tools")
    if tools is None and info.field_name == "tool_choice" and info.data.get("functions"):
        tools = [Tool(function=f) for f in info.data["functions"]]
    if value is not None and tools is None:
        raise ValueError(f"{info.field_name!r} is only allowed when 'tools' are specified")
    named = isinstance(value, NamedToolChoice) and value.function.name
    if named and named not in {t.function.name for t in tools or ()}:
        raise ValueError(f"tool_choice names function {value.function.name!r}, which tools does not declare")
    if value == "required" and not tools:
        raise ValueError("tool_choice \"required\" needs at least one tool")
    return value


def functions_not_beside_tools(cls: Any, functions: list[FunctionDefinition] | None,
                               info: ValidationInfo) -> list[FunctionDefinition] | None:
    """A `functions` validator: not beside `tools`, in OpenAI's words; [] is nothing asked. Raises ValueError."""
    if functions is not None and info.data.get("tools") is not None:  # OpenAI's words
        raise ValueError("'functions' and 'tools' cannot both be provided. 'functions' are deprecated; use the "
                         "'tools' parameter instead.")
    return functions or None  # [] asks for nothing, as before functions were taken


def function_call_chosen(cls: Any, value: Any, info: ValidationInfo) -> Any:
    """A `function_call` validator: only beside `functions`, not beside `tool_choice`, naming a declared function.
    Raises ValueError."""
    if value is None or "functions" not in info.data:  # not asked, or functions failed on their own
        return value
    if info.data["functions"] is None:  # OpenAI's words
        raise ValueError("'function_call' is only allowed when 'functions' are specified.")
    if info.data.get("tool_choice") is not None:
        raise ValueError("'function_call' and 'tool_choice' cannot both be provided. 'function_call' is "
                         "deprecated; use 'tool_choice' with 'tools' instead.")
    if isinstance(value, ChosenFunction) and value.name not in {f.name for f in info.data["functions"]}:
        raise ValueError(f"function_call names function {value.name!r}, which functions does not declare")
    return value
