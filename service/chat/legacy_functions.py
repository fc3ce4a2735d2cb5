"""OpenAI's legacy function calling on the one tool mechanism: the conversation's side.

Deprecated, not removed, and still sent: Dify's OpenAI-API-compatible plugin in its "Function Call" mode, older
LangChain chains. The request's `functions` and `function_call` are its tools and tool_choice
(service/chat/schemas.py); here an assistant message's `function_call` becomes one tool call, its id made up the
same way every turn (the prefix cache sees the same text), and a `role: "function"` message the tool message that
answers it. The reply's legacy shape is service/chat/output.py's (ChatTranslator's `legacy`).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Sequence

from service.chat.prompt import MessageError
from service.chat.schemas import ChatCompletionRequest, ChatMessage, FunctionCall, ToolCall
from service.http.errors import APIError

__all__ = ["legacy_call_id", "with_legacy_calls", "named_as_sent"]


def legacy_call_id(at: int, call: FunctionCall) -> str:
    """The id of the call in message `at`: `call_` and 24 hex digits, as OpenAI's, drawn from the message's place,
    name and arguments. Raises nothing."""
    arguments = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments, sort_keys=True)
    digest = hashlib.sha256(f"{at}\0{call.name}\0{arguments}".encode()).hexdigest()
    return f"call_{digest[:24]}"


def with_legacy_calls(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """`messages` with each assistant `function_call` as a tool call and each function message as the tool message
    answering the latest call of its name that the assistant message before its run of results left unanswered
    (copies; the input is not changed).

    Raises MessageError naming a function message that answers no such call, or a function_call whose result does
    not follow it (as a tool call's must)."""
    out: list[ChatMessage] = []
    waiting: list[tuple[str, str]] = []  # (id, name) of the last assistant message's calls not yet answered
    legacy_at: int | None = None  # that message, when its call was a function_call
    for n, message in enumerate(messages):
        if message.role == "function":
            if message.tool_call_id is not None:  # OpenAI's function messages have none: it would be replaced unread
                raise MessageError(f"messages.{n}.tool_call_id", "a message with role 'function' has no tool_call_id "
                                   "(it answers the latest call of its name): send role 'tool' to answer by id")
            slot = next((k for k in reversed(range(len(waiting))) if waiting[k][1] == message.name), None)
            if slot is None:
                raise MessageError(f"messages.{n}.role", _unanswerable(message.name, waiting))
            call_id, _ = waiting.pop(slot)
            out.append(message.model_copy(update={"role": "tool", "tool_call_id": call_id}))
            continue
        _check_answered(legacy_at, waiting)
        legacy_at = None
        if message.role == "tool":
            waiting = [w for w in waiting if w[0] != message.tool_call_id]
        elif message.role == "assistant" and message.function_call is not None:
            call = ToolCall(id=legacy_call_id(n, message.function_call), function=message.function_call)
            message = message.model_copy(update={"tool_calls": [call], "function_call": None})
            waiting, legacy_at = [(str(call.id), call.function.name)], n
        else:
            waiting = [(c.id, c.function.name) for c in message.tool_calls or () if c.id]
        out.append(message)
    _check_answered(legacy_at, waiting)
    return out


def _check_answered(legacy_at: int | None, waiting: list[tuple[str, str]]) -> None:
    # What results_in_call_order says of a tool call left unanswered, in the legacy fields' words.
    if legacy_at is not None and waiting:
        raise MessageError(f"messages.{legacy_at}.function_call",
                           "An assistant message with 'function_call' must be followed by a message with role "
                           f"'function' and name {waiting[0][1]!r} giving its result.")


def _unanswerable(name: str | None, waiting: list[tuple[str, str]]) -> str:
    if not waiting:
        return ("messages with role 'function' must be a response to a preceding assistant message with "
                "'function_call'")
    return (f"no call of function {name!r} before this message awaits its result (the calls awaiting one: "
            f"{', '.join(repr(w[1]) for w in waiting)})")


_TOOL_FIELD = re.compile(r"tools(?:\.(\d+)\.function)?((?:\.\w+)*)")


def named_as_sent(exc: APIError, body: ChatCompletionRequest) -> APIError:
    """`exc` naming the legacy field the request sent where it names the tools or tool_choice made of it
    (`tools.0.function.strict` → `functions.0.strict`, `tool_choice` → `function_call`). Raises nothing."""
    param = exc.param or ""
    new = None
    if body.legacy_reply() and (tool := _TOOL_FIELD.fullmatch(param)) is not None:
        new = "functions" + (f".{tool[1]}" if tool[1] else "") + tool[2]
    elif param == "tool_choice" and body.function_call is not None:
        new = "function_call"
    if new is None:
        return exc
    message = new + exc.message[len(param):] if exc.message.startswith(param + ":") else exc.message
    return APIError(exc.status, message, type=exc.type, param=new, code=exc.code, retry_after=exc.retry_after,
                    close=exc.close, should_retry=exc.should_retry)
