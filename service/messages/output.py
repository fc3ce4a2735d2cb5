"""A reply's chat deltas as Anthropic content blocks and stream events, in one place for streamed and non-streamed
replies (a non-streamed reply frames no events).

Blocks open as the reply's kind of text changes — thinking, text, each tool call (`tool_use`, its arguments as
`input_json_delta`s) — and each stops before the next starts: message_start, then per block content_block_start,
its deltas and content_block_stop, then message_delta (stop_reason, usage) and message_stop; a stream that fails
ends with message_delta (usage, stop_reason null) and an `error` event.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Callable

from pydantic_core import from_json

from service.chat.replies import ChoiceDelta
from service.http.errors import APIError
from service.http.sse import line_safe
from service.messages.errors import anthropic_error_body

__all__ = ["MessageOutput", "stop_reason"]

# Where chat's finish_reason says why the reply ended → Anthropic's stop_reason ("stop" is end_turn unless a stop
# sequence cut it).
_STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}


def stop_reason(finish_reason: str, stop_sequence: str | None) -> str:
    """Anthropic's stop_reason for chat's `finish_reason`. Raises nothing."""
    if finish_reason == "stop" and stop_sequence is not None:
        return "stop_sequence"
    return _STOP_REASONS.get(finish_reason, "end_turn")


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return line_safe(f"event: {kind}\ndata: {json.dumps({'type': kind, **payload}, ensure_ascii=False)}\n\n".encode())


def _tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object `input` is (chat's calls carry a JSON object; another value is kept under
    `input`, never dropped). Those of a call max_tokens cut are JSON cut short: read as far as they go, as the
    anthropic SDK reads a stream's partial JSON (pydantic-core's partial mode: a value cut short is left out), else
    {}. Raises nothing."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        try:
            value = from_json(arguments, allow_partial=True)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}
    return value if isinstance(value, dict) else {"input": value}


class MessageOutput:
    """One reply's blocks and the stream's events. `feed` a chat delta, `close` at the reply's end (the events of
    its end; `message()` then gives the finished Message); `opening()` is message_start, `keepalive()` a ping,
    `failed` the error event ending a stream. `usage()` gives the reply's usage as it stands."""

    def __init__(self, model: str, usage: Callable[[], dict[str, Any]], streamed: bool = True,
                 context: dict[str, Any] | None = None, thinking_shown: bool = True) -> None:
        self.id = f"msg_{uuid.uuid4().hex[:24]}"
        self._model = model
        self._usage = usage
        self._streamed = streamed
        # The request's context_management: the reply's (on message_delta when streamed), as Anthropic's.
        self._context = {"context_management": context} if context is not None else {}
        self._thinking_shown = thinking_shown  # thinking.display "omitted": the blocks come empty
        self.blocks: list[dict[str, Any]] = []
        self._open: str | None = None  # the kind of the block being written ("thinking", "text", "tool_use")
        self._call: int | None = None  # the chat call index of an open tool_use block
        self._text: list[str] = []
        self.started = False  # message_start went out
        self._end: dict[str, Any] = {"stop_reason": None, "stop_sequence": None}

    def message(self) -> dict[str, Any]:
        """The Message as it stands (its blocks so far, stop_reason once closed). Raises nothing."""
        return {"id": self.id, "type": "message", "role": "assistant", "model": self._model,
                "content": list(self.blocks), **self._end, "usage": {**self._usage(), "service_tier": "standard"},
                **self._context}

    # -- events ---------------------------------------------------------------------------------------------------

    def _event(self, kind: str, **payload: Any) -> bytes:
        return _event(kind, payload) if self._streamed else b""

    def opening(self) -> bytes:
        """message_start, once (nothing after). Its usage splits the input into cached and uncached tokens, known
        from the row's first delta: sent before it, a queued prompt's read 0 cached (Claude Code and the SDKs take
        the split from message_start). Raises nothing."""
        if self.started:
            return b""
        self.started = True
        return self._event("message_start", message={**self.message(), "content": [],
                                                      **({"context_management": None} if self._context else {})})

    def keepalive(self) -> bytes:
        """A ping: what keeps a stream alive while its prompt waits (before message_start too: the anthropic SDKs,
        Python's and TypeScript's, and the AI SDK skip a ping wherever it comes) or a reply holds text back. Raises
        nothing."""
        return self._event("ping")

    def feed(self, delta: ChoiceDelta) -> list[bytes]:
        """The events of one chat delta. Raises nothing."""
        events: list[bytes] = []
        if delta.reasoning_content:
            events += self._into("thinking")
            if self._thinking_shown:
                events.append(self._delta({"type": "thinking_delta", "thinking": delta.reasoning_content},
                                          delta.reasoning_content))
        if delta.content:
            events += self._into("text")
            events.append(self._delta({"type": "text_delta", "text": delta.content}, delta.content))
        for call in delta.tool_calls or ():
            if call.id is not None:  # a call's first delta: its name
                events += self._close()
                events += self._start({"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}",
                                       "name": call.function.name if call.function else "", "input": {}}, "tool_use")
                self._call = call.index
            arguments = call.function.arguments if call.function is not None else None
            if arguments and self._open == "tool_use" and self._call == call.index:
                events.append(self._delta({"type": "input_json_delta", "partial_json": arguments}, arguments))
        return events

    def close(self, reason: str, stop_sequence: str | None) -> list[bytes]:
        """The events ending the reply: the open block's stop, message_delta, message_stop. Raises nothing."""
        events = self._close()
        self._end = {"stop_reason": reason, "stop_sequence": stop_sequence}
        events.append(self._event("message_delta", delta=dict(self._end), usage=self._usage(), **self._context))
        events.append(self._event("message_stop"))
        return events

    def failed(self, error: APIError) -> bytes:
        """The end of a stream that failed after its headers: message_delta with the usage as far as the reply got
        and no stop_reason (the anthropic SDKs' accumulators take it: their final message's usage; a block left open is
        not stopped, so no cut tool_use reads as whole), then the error event, on which the SDKs raise (what was said
        before stays said). Raises nothing."""
        return self._event("message_delta", delta={"stop_reason": None, "stop_sequence": None},
                           usage=self._usage()) + self._event("error", **anthropic_error_body(error))

    # -- blocks ----------------------------------------------------------------------------------------------------

    def _into(self, kind: str) -> list[bytes]:
        """Events starting a block of `kind` unless one is open (stopping another first)."""
        if self._open == kind:
            return []
        events = self._close()
        empty: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else \
            {"type": "text", "text": ""}
        return events + self._start(empty, kind)

    def _start(self, block: dict[str, Any], kind: str) -> list[bytes]:
        self._open = kind
        self.blocks.append(block)
        return [self._event("content_block_start", index=len(self.blocks) - 1, content_block=block)]

    def _delta(self, delta: dict[str, Any], text: str) -> bytes:
        self._text.append(text)
        return self._event("content_block_delta", index=len(self.blocks) - 1, delta=delta)

    def _close(self) -> list[bytes]:
        """The open block's stop; its final form replaces it in `blocks`."""
        if self._open is None:
            return []
        kind, text, self._open, self._call, self._text = self._open, "".join(self._text), None, None, []
        index = len(self.blocks) - 1
        block = self.blocks[index]
        if kind == "thinking":
            self.blocks[index] = {**block, "thinking": text}
        elif kind == "text":
            self.blocks[index] = {**block, "text": text}
        else:
            self.blocks[index] = {**block, "input": _tool_input(text)}
        return [self._event("content_block_stop", index=index)]
