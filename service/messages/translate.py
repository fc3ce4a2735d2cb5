"""A Messages request as the chat request it asks for: `system` and the turns' blocks become chat messages, the
tools chat tools, the settings chat's fields, so rendering, admission and sampling are chat's own.

A user turn's tool results become tool messages, before its text (chat pairs a result with the call of the
assistant turn just before it); user turns in a row are one user turn, as Anthropic merges them (Mistral's and
Gemma's templates refuse two). A system turn mid-conversation is read within the user turn beside it: where it
was said, the cached prefix before it kept, and no template refuses it. Earlier thinking goes back as the turn's
reasoning; redacted thinking is left out. A last assistant turn is a prefill: chat's `continue_final_message`, so the
reply continues its text and holds only the continuation, as Anthropic's does. Structured output
(`output_config.format`) is chat's response_format json_schema, strict; a tool's `strict` its function's.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from service.chat.schemas import ChatCompletionRequest
from service.http.errors import APIError
from service.messages.schemas import (CountTokensRequest, MessagesRequest, TextBlock, ThinkingBlock, ToolResultBlock,
                                      ToolUseBlock)

__all__ = ["chat_request", "chat_fields", "anthropic_words", "CHAT_FIELDS"]

# Chat's field names in errors about the translated request → the Messages fields they came from.
CHAT_FIELDS = {"reasoning_effort": "thinking", "stop": "stop_sequences", "parallel_tool_calls": "tool_choice",
               "response_format": "tool_choice"}
# output_config.effort → chat's effort: gpt-oss has three.
_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
# Chat's words for its tool_choice values → Anthropic's (chat's "required" is "any", a named function a "tool").
_WORDS = {'tool_choice "required"': 'tool_choice "any"', "names function": "names tool"}
# Chat needs a name for a json_schema; Anthropic's format has none.
_FORMAT_NAME = "output"


def anthropic_words(message: str) -> str:
    """A chat error's message with chat's tool_choice words as Anthropic's. Raises nothing."""
    for chat, anthropic in _WORDS.items():
        message = message.replace(chat, anthropic)
    return message


def _asked_effort(body: CountTokensRequest) -> str | None:
    """output_config.effort, but for "high" without `thinking`: Anthropic's default, the same as none asked (Claude
    Code sends it with thinking off, CLAUDE_CODE_DISABLE_THINKING)."""
    effort = body.output_config.effort if body.output_config is not None else None
    return None if effort == "high" and body.thinking is None else effort


def chat_fields(body: CountTokensRequest) -> dict[str, str]:
    """CHAT_FIELDS for `body`: an effort asked by output_config alone, and structured output, are named so in
    errors. Raises nothing."""
    fields = dict(CHAT_FIELDS)
    if _asked_effort(body) is not None and body.thinking is None:
        fields["reasoning_effort"] = "output_config.effort"
    if body.json_format() is not None:
        fields["response_format"] = "output_format" if body.output_format is not None else "output_config.format"
    return fields


def _effort(body: CountTokensRequest) -> str | None:
    """The chat reasoning_effort `thinking` and `output_config.effort` ask for: thinking disabled is "none"; else
    the effort named, or the budget's (Claude Code's "think", "think hard" and "ultrathink" budgets are 4,000,
    10,000 and 31,999 tokens); templates without an effort read it as thinking on."""
    thinking, effort = body.thinking, _asked_effort(body)
    if thinking is not None and thinking.type == "disabled":
        return "none"
    if effort is not None:
        return _EFFORTS[effort]
    if thinking is None:
        return None
    budget = thinking.budget_tokens
    return "medium" if budget is None else "low" if budget <= 4096 else "medium" if budget <= 16384 else "high"


def _system(body: CountTokensRequest) -> str | None:
    if body.system is None:
        return None
    return body.system if isinstance(body.system, str) else "\n\n".join(b.text for b in body.system if b.text)


def _messages(body: CountTokensRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if system := _system(body):
        out.append({"role": "system", "content": system})
    calls_before: set[str] = set()  # the tool_use ids of the assistant turn just before (a system turn aside)
    for i, turn in enumerate(body.messages):
        last = i == len(body.messages) - 1
        if not turn.content and turn.role == "assistant" and last:  # Anthropic's "optional final assistant message"
            continue
        if not turn.content:  # "" or []: Anthropic's words (chat's refusal named `messages` and a list of none)
            raise APIError(400, f"messages.{i}: all messages must have non-empty content except for the optional "
                                "final assistant message", param=f"messages.{i}.content", code="invalid_value")
        blocks = [TextBlock(type="text", text=turn.content)] if isinstance(turn.content, str) else turn.content
        text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
        if turn.role == "system" and all(m["role"] == "system" for m in out):  # before any turn: `system`'s
            if text:
                out[:] = [{"role": "system", "content": "\n\n".join([m["content"] for m in out] + [text])}]
            continue
        if turn.role == "assistant":
            if last:
                _check_prefill(body, i, blocks, text)
            calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
                     for b in blocks if isinstance(b, ToolUseBlock)]
            calls_before = set()
            for j, b in enumerate(blocks):
                if isinstance(b, ToolUseBlock):
                    if b.id in calls_before:  # chat refused it in its own words (tool_calls, tool_call_id)
                        raise APIError(400, f"messages.{i}.content.{j}: `tool_use` ids must be unique: {b.id}",
                                       param=f"messages.{i}.content.{j}.id", code="invalid_value")
                    calls_before.add(b.id)
            message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
            if calls:
                message["tool_calls"] = calls
            if thinking := "".join(b.thinking for b in blocks if isinstance(b, ThinkingBlock)):
                message["reasoning_content"] = thinking
            out.append(message)
            continue
        if turn.role == "user":
            _check_results(i, blocks, calls_before)
            calls_before = set()
        out += [{"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()}
                for b in blocks if isinstance(b, ToolResultBlock)]
        if not text:
            continue
        if out and out[-1]["role"] == "user":  # user turns in a row: one turn
            out[-1]["content"] += "\n\n" + text
        else:
            out.append({"role": "user", "content": text})
    return out


def _check_prefill(body: CountTokensRequest, i: int, blocks: Any, text: str) -> None:
    """Refuse a last assistant turn (a prefill the reply continues) as Anthropic refuses it: with extended thinking
    on, ending in whitespace, or holding a tool_use (what follows a call is its result). Raises APIError 400."""
    if body.thinking is not None and body.thinking.type != "disabled":
        raise APIError(400, "thinking: a last assistant turn (a prefill) is not supported with extended thinking, as "
                            "at Anthropic: disable thinking or end with a user turn", param="thinking",
                       code="invalid_value")
    if text != text.rstrip():
        raise APIError(400, f"messages.{i}.content: final assistant content cannot end with trailing whitespace",
                       param=f"messages.{i}.content", code="invalid_value")
    if uses := [j for j, b in enumerate(blocks) if isinstance(b, ToolUseBlock)]:
        raise APIError(400, f"messages.{i}.content.{uses[0]}: a last assistant turn is a prefill the reply continues; "
                            "a `tool_use` there needs its `tool_result` in a user turn after it",
                       param=f"messages.{i}.content.{uses[0]}", code="invalid_value")


def _check_results(i: int, blocks: Any, calls_before: set[str]) -> None:
    """Refuse a tool_result answering no tool_use of the assistant turn before, in Anthropic's words (chat's own
    check named `tool_call_id` and counted `system` as a message). Raises APIError 400."""
    for j, block in enumerate(blocks):
        if isinstance(block, ToolResultBlock) and block.tool_use_id not in calls_before:
            where = f"messages.{i}.content.{j}"
            raise APIError(400, f"{where}: unexpected `tool_use_id` found in `tool_result` blocks: "
                                f"{block.tool_use_id}. Each `tool_result` block must have a corresponding `tool_use` "
                                "block in the previous message.", param=f"{where}.tool_use_id", code="invalid_value")


def chat_request(body: CountTokensRequest) -> ChatCompletionRequest:
    """The chat request `body` asks for (a count_tokens body: its prompt alone).

    Raises APIError 400 naming the field for what chat's rules refuse of the translated request (a tool result
    answering no call, a forced call without tools), and for a prefill Anthropic refuses (_check_prefill)."""
    messages = _messages(body)
    chat: dict[str, Any] = {"model": body.model, "messages": messages, "reasoning_effort": _effort(body),
                            # a last assistant turn is a prefill: the reply continues it
                            "continue_final_message": bool(messages) and messages[-1]["role"] == "assistant" or None}
    if (output := body.json_format()) is not None:
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": _FORMAT_NAME,
                                                                          "schema": output.schema_, "strict": True}}
    if isinstance(body, MessagesRequest):
        chat.update(stream=bool(body.stream), max_tokens=body.max_tokens, temperature=body.temperature,
                    top_p=body.top_p, top_k=body.top_k, stop=body.stop_sequences or None,
                    user=body.metadata.user_id if body.metadata is not None else None)
    if body.tools is not None or body.tool_choice is not None:
        choice = body.tool_choice
        chat["tools"] = [{"type": "function", "function": {
            "name": t.name, "parameters": t.input_schema, **({"description": t.description} if t.description else {}),
            **({"strict": t.strict} if t.strict is not None else {})}} for t in body.tools or ()]
        if choice is not None:
            chat["tool_choice"] = ({"type": "function", "function": {"name": choice.name}} if choice.type == "tool"
                                   else {"auto": "auto", "any": "required", "none": "none"}[choice.type])
            if choice.disable_parallel_tool_use:
                chat["parallel_tool_calls"] = False
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in chat.items() if v is not None})
    except ValidationError as exc:
        problem = exc.errors()[0]
        message = anthropic_words(str(problem.get("msg", exc)).removeprefix("Value error, "))
        loc = [str(part) for part in problem.get("loc") or ("messages",)]
        # Chat nests a tool's fields under `function`; the tools are the request's, index for index.
        param = ("tools." + loc[1] if loc[0] == "tools" and len(loc) > 1 else
                 CHAT_FIELDS.get(loc[0], loc[0]) if loc[0] in ("tool_choice", "parallel_tool_calls") else
                 chat_fields(body)["response_format"] if loc[0] == "response_format" else "messages")
        raise APIError(400, f"{param}: {message}", param=param, code="invalid_value") from None
