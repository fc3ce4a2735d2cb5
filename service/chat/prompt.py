"""Chat prompt rendering — one implementation for the server, `tandem generate` and bench/agent_turns.py.

OpenAI messages become the dicts chat templates expect; the template (or, for a tokenizer without one,
mlx-lm's plain "role: content" lines) turns them into token ids with the generation prompt appended.
`system_prefix_end` finds where the system prompt ends in those ids: a prefix-cache segment boundary.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from service.chat.schemas import ChatCompletionRequest, ChatMessage

__all__ = [
    "has_chat_template",
    "template_messages",
    "template_kwargs",
    "request_tools",
    "render_text",
    "encode_rendered",
    "render_prompt",
    "system_prefix_end",
    "common_prefix_boundary",
    "system_probe",
]


def has_chat_template(tokenizer: Any) -> bool:
    """True when the tokenizer renders conversations with a template (mlx-lm's TokenizerWrapper says so;
    a bare HF tokenizer has one when `chat_template` is set). Raises nothing."""
    flag = getattr(tokenizer, "has_chat_template", None)
    if flag is None:
        flag = bool(getattr(tokenizer, "chat_template", None))
    return bool(flag)


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """OpenAI messages → the dicts chat templates expect (`developer` → `system`, parts joined,
    tool-call arguments as objects, prior thinking under `reasoning_content`). Raises nothing."""
    out: list[dict[str, Any]] = []
    for message in messages:
        item: dict[str, Any] = {
            "role": "system" if message.role == "developer" else message.role,
            "content": message.text(),
        }
        if message.name:
            item["name"] = message.name
        if message.tool_call_id:
            item["tool_call_id"] = message.tool_call_id
        if message.tool_calls:
            item["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments)},
                }
                for call in message.tool_calls
            ]
        if reasoning := (message.reasoning_content or message.reasoning):
            item["reasoning_content"] = reasoning
        out.append(item)
    return out


def _arguments(arguments: str | dict[str, Any]) -> Any:
    # Templates iterate over arguments (`arguments | items`) or dump them; an object serves both.
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return arguments
    return arguments


def template_kwargs(body: ChatCompletionRequest) -> dict[str, Any]:
    """Extra template variables of a request (`chat_template_kwargs`; reasoning_effort "none" switches
    thinking off where the template reads `enable_thinking`). Raises nothing."""
    kwargs = dict(body.chat_template_kwargs or {})
    if body.reasoning_effort == "none":
        kwargs.setdefault("enable_thinking", False)
    return kwargs


def request_tools(body: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The request's tool definitions as plain dicts for the template, or None. Raises nothing."""
    return [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None


def render_text(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                kwargs: dict[str, Any] | None = None) -> tuple[str, bool]:
    """The conversation as the model's prompt text, with the generation prompt appended, and whether its
    encoding adds the tokenizer's special tokens (only without a template; a template writes its own).
    Blocking, pure Python (jinja). Raises what the template raises (TemplateError, raise_exception, a bad
    kwarg)."""
    if not has_chat_template(tokenizer):
        # No template: plain "role: content" lines, as mlx-lm does.
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: ", True
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False,
                                         **(kwargs or {}))
    return str(text), False


def encode_rendered(tokenizer: Any, text: str, special: bool) -> list[int]:
    """Token ids of rendered prompt text (as apply_chat_template(tokenize=True) would give). Blocking.
    Raises what the tokenizer raises."""
    tokens = tokenizer.encode(text) if special else tokenizer.encode(text, add_special_tokens=False)
    return [int(t) for t in tokens]


def render_prompt(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                  kwargs: dict[str, Any] | None = None) -> list[int]:
    """Token ids of the conversation with the generation prompt appended. Blocking: call it off the event
    loop. Raises what the template raises (jinja TemplateError, a template's raise_exception, a bad kwarg)."""
    return encode_rendered(tokenizer, *render_text(tokenizer, messages, tools, kwargs))


def system_prefix_end(tokenizer: Any, messages: list[dict[str, Any]], prompt: Sequence[int],
                      tools: list[dict[str, Any]] | None = None, kwargs: dict[str, Any] | None = None) -> tuple[int, ...]:
    """Token offset where the leading system messages (and tool definitions) end in `prompt`, as a
    one-element tuple; empty when there is none or the template cannot render the system block alone.
    Blocking. Raises nothing (a template that insists on a full conversation gives no boundary)."""
    probe_messages = system_probe(messages)
    if not probe_messages or not has_chat_template(tokenizer):
        return ()
    try:
        # The system block as the template renders it before any user turn: its common prefix with the
        # prompt is what every conversation with this system prompt (and tools) shares.
        probe = render_prompt(tokenizer, probe_messages, tools, kwargs)
    except Exception:  # noqa: BLE001 — no boundary, no harm
        return ()
    return common_prefix_boundary(probe, prompt)


def system_probe(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The leading system messages and an empty user turn (what `system_prefix_end` renders), or [] when
    the conversation has no leading system block. Raises nothing."""
    n = 0
    while n < len(messages) and messages[n]["role"] == "system":
        n += 1
    if n == 0 or n == len(messages):
        return []
    return messages[:n] + [{"role": "user", "content": ""}]


def common_prefix_boundary(probe: Sequence[int], prompt: Sequence[int]) -> tuple[int, ...]:
    """(length of the common prefix,) when it ends inside `prompt`, else (). Raises nothing."""
    end = 0
    for a, b in zip(probe, prompt):
        if a != b:
            break
        end += 1
    return (end,) if 0 < end < len(prompt) else ()
