"""Tools and tool calls written as text, for chat templates that take neither.

A template that takes no tools is told of them in its system turn (the widely trained <tool_call> JSON format),
and one that does not render calls gets earlier calls and their results written into the turns as that text.
"""

from __future__ import annotations

import json
from typing import Any

from service.chat.schemas import ChatCompletionRequest

__all__ = ["call_arguments", "request_tools", "with_tool_prompt", "calls_as_text"]


def call_arguments(arguments: str | dict[str, Any]) -> Any:
    """A call's arguments as the object they encode; a string that is not JSON as it is. Raises nothing."""
    # Templates iterate over arguments (`arguments | items`) or dump them; an object serves both.
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return arguments
    return arguments


def request_tools(body: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The request's tool definitions as plain dicts for the template, or None (also for tool_choice "none":
    the model is not shown tools it may not call). Raises nothing."""
    if not body.tools or body.tool_choice == "none":
        return None
    return [tool.model_dump(exclude_none=True) for tool in body.tools]


# How a model whose chat template takes no tools is told of them (the widely trained <tool_call> JSON format);
# its calls are then parsed with mlx-lm's json_tools parser (service/chat/output.py).
_TOOL_PROMPT = (
    "# Tools\n\nYou may call one or more functions to help with the user's request. The functions are described "
    "below in JSON Schema, inside <tools></tools>:\n<tools>\n{tools}\n</tools>\n\nTo call a function, write a JSON "
    'object with its name and arguments inside <tool_call></tool_call> tags:\n<tool_call>\n{{"name": '
    '<function-name>, "arguments": <arguments-json-object>}}\n</tool_call>'
)


def with_tool_prompt(messages: list[dict[str, Any]], tools: list[dict[str, Any]], *,
                     in_user_turn: bool = False) -> list[dict[str, Any]]:
    """The conversation with the tools described in its system message (added first when there is none), for a
    chat template that does not take tools itself; `in_user_turn`: without a system message, at the start of the
    first user turn instead (added first when there is none), for a template that refuses a system turn.
    Raises nothing."""
    block = _TOOL_PROMPT.format(tools="\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools))
    if messages and messages[0]["role"] == "system":
        # A leading run of system turns (system then developer) becomes one: templates keep only the first
        # (Llama's) or only the last (DeepSeek-R1's), and the tools must survive either.
        run = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
        merged = dict(messages[0], content="\n\n".join(str(m["content"]) for m in messages[:run] if m["content"]))
        return [_joined(merged, block, first=False), *messages[run:]]
    if in_user_turn:
        at = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
        if at is not None:
            return [*messages[:at], _joined(messages[at], block, first=True), *messages[at + 1:]]
        return [{"role": "user", "content": block}, *messages]
    return [{"role": "system", "content": block}, *messages]


def _joined(message: dict[str, Any], block: str, *, first: bool) -> dict[str, Any]:
    # The block before or after the message's own text, a blank line between them.
    if not message["content"]:
        return dict(message, content=block)
    return dict(message, content=f"{block}\n\n{message['content']}" if first else f"{message['content']}\n\n{block}")


def calls_as_text(messages: list[dict[str, Any]], list_marker: str | None = None) -> list[dict[str, Any]]:
    """The conversation for a template that does not render tool calls: an assistant's calls written into its
    content as the <tool_call> JSON it was told to write (`list_marker`: as that marker and one JSON list of the
    calls, the format Granite's template asks for), and tool results as a user turn of <tool_response> blocks
    (consecutive results in one turn, as Qwen's and Hermes' templates put them), so the model still sees what it
    called and what came back. Raises nothing."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "assistant" and message.get("tool_calls"):
            # Arguments as the object they encode (as the tool prompt asks for), not a JSON string of JSON; a
            # string that is not JSON stays as it is.
            objects = [{"name": call["function"]["name"], "arguments": call_arguments(call["function"]["arguments"])}
                       for call in message["tool_calls"]]
            if list_marker is not None:
                calls = list_marker + json.dumps(objects, ensure_ascii=False)
            else:
                calls = "\n".join(f"<tool_call>\n{json.dumps(o, ensure_ascii=False)}\n</tool_call>" for o in objects)
            content = f"{message['content']}\n{calls}" if message["content"] else calls
            out.append({k: v for k, v in message.items() if k != "tool_calls"} | {"content": content})
        elif message["role"] == "tool":
            block = f"<tool_response>\n{message['content']}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        else:
            out.append(message)
    return [{k: v for k, v in m.items() if k != "_tool_results"} for m in out]
