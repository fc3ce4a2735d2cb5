"""A Responses request as the chat request it asks for: `instructions` and the input items become chat messages,
the tools chat tools, the settings chat's fields, so rendering, admission and sampling are chat's own.

Custom tools are offered as functions of one string (`input`), a namespace's functions under `namespace + name`;
`ToolNames` maps a called name back to the item the reply gives.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from pydantic import TypeAdapter, ValidationError

from service.chat.schemas import ChatCompletionRequest
from service.http.errors import APIError, context_length_exceeded
from service.responses.schemas import (CustomTool, CustomToolCallItem, CustomToolCallOutput, FunctionCallItem,
                                       FunctionCallOutput, FunctionTool, HostedTool, InputItem, InputMessage,
                                       ItemReference, NamespaceTool, ReasoningItem, ResponsesRequest, part_text)

__all__ = ["ToolNames", "chat_request", "input_items", "requested_effort", "seal_reasoning", "unseal_reasoning"]

# This server's `encrypted_content`: the thinking itself behind a prefix (nothing here is secret from the client).
_SEAL = "tandem-reasoning-v1:"

_CUSTOM_PARAMETERS = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}


def seal_reasoning(text: str) -> str:
    """The `encrypted_content` that brings `text` back on the next turn. Raises nothing."""
    return _SEAL + text


def unseal_reasoning(content: str | None) -> str | None:
    """The thinking in this server's `encrypted_content`; None for another server's (unreadable). Raises nothing."""
    return content[len(_SEAL):] if content and content.startswith(_SEAL) else None


@dataclass
class ToolNames:
    """What each name offered to the model stands for: (kind, the tool's own name, its namespace)."""

    offered: dict[str, tuple[str, str, str | None]] = field(default_factory=dict)

    def item(self, name: str) -> tuple[str, str, str | None]:
        """("function" or "custom", the declared name, namespace) of a called name; an undeclared name (the
        model's mistake) is a function call of that name. Raises nothing."""
        return self.offered.get(name, ("function", name, None))


def _custom_description(tool: CustomTool) -> str | None:
    """The tool's description, with the grammar its input follows when it declares one."""
    grammar = tool.format
    if grammar is None or grammar.type != "grammar" or not grammar.definition:
        return tool.description
    said = f"The `input` string follows this {grammar.syntax or ''} grammar:\n{grammar.definition}".replace("  ", " ")
    return f"{tool.description}\n\n{said}" if tool.description else said


def _chat_tools(body: ResponsesRequest) -> tuple[list[dict[str, Any]], ToolNames]:
    tools: list[dict[str, Any]] = []
    names = ToolNames()

    def offer(name: str, kind: str, own: str, namespace: str | None, description: str | None,
              parameters: dict[str, Any] | None, param: str, strict: bool | None = None) -> None:
        if len(name) > 64:
            raise APIError(400, f"{param}: the namespace and the function's name together are over 64 characters",
                           param=param, code="invalid_value")
        if name in names.offered:
            raise APIError(400, f"{param}: a second tool named {name!r}", param=param, code="invalid_value")
        names.offered[name] = (kind, own, namespace)
        function: dict[str, Any] = {"name": name}
        if description is not None:
            function["description"] = description
        if parameters is not None:
            function["parameters"] = parameters
        if strict:
            function["strict"] = True
        tools.append({"type": "function", "function": function})

    for i, tool in enumerate(body.tools or ()):
        if isinstance(tool, FunctionTool):
            offer(tool.name, "function", tool.name, None, tool.description, tool.parameters, f"tools[{i}].name",
                  tool.strict)
        elif isinstance(tool, CustomTool):
            offer(tool.name, "custom", tool.name, None, _custom_description(tool), _CUSTOM_PARAMETERS,
                  f"tools[{i}].name")
        elif isinstance(tool, NamespaceTool):
            for j, inner in enumerate(tool.tools):
                offer(tool.name + inner.name, "function", inner.name, tool.name, inner.description, inner.parameters,
                      f"tools[{i}].tools[{j}].name", getattr(inner, "strict", None))
    return tools, names


_ITEM = TypeAdapter(InputItem)


# What `issued` gives for an id: the item and its size in characters (None: not kept).
Issued = Callable[[str], "tuple[dict[str, Any], int] | None"]


def _resolved(items: list[Any], issued: Issued, limit: int | None) -> list[Any]:
    """The items with each `item_reference` replaced by the item it names.

    Raises APIError 400 naming the reference that names no item this server still has, or the one past which the
    referenced items hold more characters than the context can (`limit`; a 7 MB body of references to one long
    reply was a 650 MB conversation)."""
    out, referenced = [], 0
    for i, item in enumerate(items):
        if isinstance(item, ItemReference):
            found = issued(item.id)
            try:
                resolved = _ITEM.validate_python(found[0]) if found is not None else None
            except ValidationError:  # not an item this server can read back (kept in another version's shape)
                resolved = None
            if found is None or resolved is None or isinstance(resolved, ItemReference):
                raise APIError(400, f"input.{i}: no item {item.id!r} is kept here (items are kept a while, unless "
                                    "made with store: false, and not across restarts): send the item itself "
                                    "(`store: false` makes clients do so; the Vercel AI SDK: "
                                    "providerOptions.openai.store = false)", param=f"input.{i}", code="item_not_found")
            referenced += found[1]
            if limit is not None and referenced > limit:
                raise context_length_exceeded(f"input.{i}: the items referred to hold {referenced} characters, more "
                                              "than the model's context can", param=f"input.{i}")
            item = resolved
        out.append(item)
    return out


def input_items(body: ResponsesRequest, issued: Issued = lambda item_id: None,
                earlier: Sequence[dict[str, Any]] = (), limit: int | None = None) -> list[Any]:
    """The conversation's items: `earlier` (a stored conversation `previous_response_id` continues), then the
    request's input with each `item_reference` resolved by `issued` (within `limit` characters: see _resolved).

    Raises APIError 400 naming a reference to an item that is not kept, or too many characters referred to."""
    try:
        before = [_ITEM.validate_python(item) for item in earlier]
    except ValidationError:  # kept by a version of this server that wrote them otherwise
        raise APIError(400, "previous_response_id: the kept conversation cannot be read back: send its items as "
                            "input", param="previous_response_id", code="previous_response_not_found") from None
    own = [InputMessage(role="user", content=body.input)] if isinstance(body.input, str) \
        else _resolved(body.input, issued, limit)
    return before + own


class _Turn:
    """A chat message being built: its text as parts, joined once (joining as items came was quadratic: 40,000
    one-line user turns held the event loop for 21 s)."""

    def __init__(self, role: str, text: str | None = None) -> None:
        self.role = role
        self.parts: list[str] = [] if text is None else [text]
        self.thinking: list[str] = []
        self.calls: list[dict[str, Any]] = []
        self.tool_call_id: str | None = None

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": "".join(self.parts) if self.parts else None}
        if self.thinking:
            message["reasoning_content"] = "\n\n".join(self.thinking)
        if self.calls:
            message["tool_calls"] = self.calls
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


def _messages(body: ResponsesRequest, items: list[Any]) -> list[dict[str, Any]]:
    turns: list[_Turn] = []
    thinking: list[str] = []  # reasoning items' text, for the assistant turn after them

    def assistant() -> _Turn:
        """The assistant turn calls join: the last turn when it is one without results after it."""
        if not turns or turns[-1].role != "assistant":
            turns.append(_Turn("assistant"))
        if thinking:
            turns[-1].thinking = thinking[:]
            thinking.clear()
        return turns[-1]

    for item in items:
        if isinstance(item, InputMessage):
            if item.role == "assistant":
                assistant().parts.append(part_text(item.content))
            else:
                turns.append(_Turn(item.role, part_text(item.content)))
        elif isinstance(item, ReasoningItem):
            text = ("".join(p.text for p in item.content) if item.content
                    else "\n\n".join(p.text for p in item.summary) if item.summary
                    else unseal_reasoning(item.encrypted_content))
            if text:
                thinking.append(text)
        elif isinstance(item, (FunctionCallItem, CustomToolCallItem)):
            if isinstance(item, FunctionCallItem):
                name, arguments = (item.namespace or "") + item.name, item.arguments
            else:
                name, arguments = item.name, json.dumps({"input": item.input})
            assistant().calls.append(
                {"id": item.call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        elif isinstance(item, (FunctionCallOutput, CustomToolCallOutput)):
            turn = _Turn("tool", part_text(item.output))
            turn.tool_call_id = item.call_id
            turns.append(turn)
    return _turns_joined(body.instructions, turns)


def _turns_joined(instructions: str | None, turns: list[_Turn]) -> list[dict[str, Any]]:
    """Every system and developer turn as one system turn first (`instructions`, then Codex's permissions and the
    mode changes it sends mid-conversation, in order), and user turns in a row as one (Codex sends its environment
    and the task apart): Mistral's and Gemma's templates refuse any other order, R1's and gpt-oss's drop all but one
    system turn, and a one-system-turn prompt reads the same to every model."""
    system = ([instructions] if instructions else []) + [part for t in turns if t.role in ("system", "developer")
                                                         for part in t.parts if part]
    joined: list[dict[str, Any]] = [{"role": "system", "content": "\n\n".join(system)}] if system else []
    users: list[str] = []  # a run of user turns' texts, joined once the run ends
    for turn in turns:
        if turn.role in ("system", "developer"):
            continue
        if turn.role == "user":
            users += turn.parts
            continue
        if users:
            joined.append({"role": "user", "content": "\n\n".join(users)})
            users = []
        joined.append(turn.message())
    if users:
        joined.append({"role": "user", "content": "\n\n".join(users)})
    return joined


def _cut_calls_left_out(items: list[Any]) -> list[Any]:
    """The items without the calls a max_output_tokens cut left incomplete that no output answers: they never ran
    (LangChain echoes them back but runs and answers only complete calls). Raises nothing."""
    answered = {item.call_id for item in items if isinstance(item, (FunctionCallOutput, CustomToolCallOutput))}
    return [item for item in items if not (isinstance(item, (FunctionCallItem, CustomToolCallItem))
                                           and item.status == "incomplete" and item.call_id not in answered)]


def _calls_answered(items: list[Any]) -> None:
    """Raises APIError 400 for a call without its output, or an output of no earlier call, in the Responses
    API's words (chat's spoke of tool messages, which /v1/responses has none of)."""
    calls: dict[str, int] = {}
    for i, item in enumerate(items):
        if isinstance(item, (FunctionCallItem, CustomToolCallItem)):
            calls[item.call_id] = i
        elif isinstance(item, (FunctionCallOutput, CustomToolCallOutput)):
            if calls.pop(item.call_id, None) is None:
                raise APIError(400, f"input: the output for call {item.call_id!r} answers no earlier function_call",
                               param="input", code="invalid_value")
    if calls:
        call_id = next(iter(calls))
        raise APIError(400, f"input: no output found for function call {call_id!r}: send a function_call_output "
                            "item with its call_id", param="input", code="invalid_value")


def _no_calls(body: ResponsesRequest) -> str:
    """The tool_choice of a reply max_tool_calls 0 allows no call: "none" (the tools are not shown to the model).
    Raises APIError 400 naming max_tool_calls beside a tool_choice that forces a call."""
    if body.tool_choice not in (None, "auto", "none"):
        raise APIError(400, "max_tool_calls: 0 allows no tool call, and tool_choice forces one; send one of them",
                       param="max_tool_calls", code="invalid_value")
    return "none"


def requested_effort(body: ResponsesRequest) -> str | None:
    """`reasoning.effort`, or chat's name for it at the top level (Open WebUI's). Raises APIError 400 for both."""
    effort = body.reasoning.effort if body.reasoning is not None else None
    if body.reasoning_effort is not None and effort is not None:
        raise APIError(400, "reasoning_effort: reasoning.effort and reasoning_effort at the same time are not "
                            "supported; give one", param="reasoning_effort", code="invalid_value")
    return effort if effort is not None else body.reasoning_effort


def chat_request(body: ResponsesRequest, items: list[Any] | None = None) -> tuple[ChatCompletionRequest, ToolNames]:
    """The chat request `body` asks for (`items`: the conversation's, `input_items`'s; None: the request's input
    alone), and what its tool names stand for.

    Raises APIError 400 naming the field for what chat's rules refuse of the translated request, or a reference to
    an item that is not kept."""
    tools, names = _chat_tools(body)
    items = _cut_calls_left_out(input_items(body) if items is None else items)
    _calls_answered(items)
    chat: dict[str, Any] = {
        "model": body.model, "stream": bool(body.stream), "messages": _messages(body, items),
        "max_tokens": body.max_output_tokens, "temperature": body.temperature, "top_p": body.top_p,
        "prompt_cache_key": body.prompt_cache_key, "prompt_cache_retention": body.prompt_cache_retention,
        "user": body.user, "safety_identifier": body.safety_identifier, "service_tier": body.service_tier,
    }
    if body.tools is not None or body.tool_choice is not None or body.parallel_tool_calls is not None:
        # Responses takes tool_choice without tools (Codex sends "auto" either way); chat wants a list.
        choice = _no_calls(body) if body.max_tool_calls == 0 else body.tool_choice
        if choice == "required" and body.tools and all(isinstance(t, HostedTool) for t in body.tools):
            declared = ", ".join(t.type for t in body.tools if isinstance(t, HostedTool))
            raise APIError(400, f"tool_choice: \"required\" forces a tool call, and the tools declared ({declared}) "
                                "are OpenAI's own, which are not offered to the model here: declare a function, or "
                                "send \"auto\"",
                           param="tool_choice", code="invalid_value")
        chat.update(tools=tools, parallel_tool_calls=body.parallel_tool_calls, tool_choice=choice if isinstance(
            choice, str) or choice is None else {"type": "function", "function": {"name": choice.name}})
    chat.update(body.chat_sampling(), reasoning_effort=requested_effort(body))
    if body.text is not None and body.text.format is not None:
        chat["response_format"] = body.text.format.chat_format()
    if body.structured_outputs is not None:
        if chat.get("response_format", {}).get("type", "text") != "text":  # as vLLM: one constraint
            raise APIError(400, "structured_outputs and text.format each constrain the reply: give one of them",
                           param="structured_outputs", code="invalid_value")
        chat["structured_outputs"] = body.structured_outputs.model_dump(by_alias=True, exclude_none=True)
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in chat.items() if v is not None}), names
    except ValidationError as exc:
        problem = exc.errors()[0]
        message = str(problem.get("msg", exc)).removeprefix("Value error, ")
        # Fields chat checks against each other keep their name (tool_choice naming an undeclared function; min_tokens
        # past max_output_tokens, which chat calls max_tokens); anything else came from the input items.
        field = str((problem.get("loc") or ("input",))[0])
        param = field if field in ("tool_choice", "parallel_tool_calls", "min_tokens") else "input"
        if field == "min_tokens":
            message = message.replace("max_tokens", "max_output_tokens")
        raise APIError(400, f"{param}: {message}", param=param, code="invalid_value") from None
