"""A reply's chat deltas as Responses output items and stream events, in one place for streamed and non-streamed
replies (a non-streamed reply drops the events).

Items open as the reply's kind of text changes — thinking (`reasoning`), text (`message`), each tool call
(`function_call`, or `custom_tool_call` for a custom tool) — and each closes before the next opens, so every
event of an item falls between its `response.output_item.added` and `.done`, as the openai SDK's stream helper and
Codex require. Events are `event: <type>` + `data: <json>` with a `sequence_number` counting from 0.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Sequence

from pydantic_core import from_json

from engine.contracts import TokenLogprob
from service.chat.logprobs import LogprobJson
from service.chat.replies import ChoiceDelta
from service.http.errors import APIError, error_body
from service.http.sse import line_safe
from service.responses.history import ToolNames, requested_effort, seal_reasoning
from service.responses.schemas import HostedTool, ResponsesRequest

__all__ = ["ResponseOutput"]


_NO_EVENT = (b"", b"", b"")  # an item whose deltas are not sent one by one


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseOutput:
    """One response's state: its id, the items so far, the stream's sequence numbers. `feed` a delta, `close` at
    the reply's end; `final` gives the finished Response, `failed` the events ending a failed stream, `response()`
    the object as it stands. Not `streamed`, no event is framed (the events are empty bytes)."""

    def __init__(self, body: ResponsesRequest, model: str, names: ToolNames,
                 streamed: bool = True, logprobs: LogprobJson | None = None) -> None:
        """`logprobs`: the writer of the `output_text` log probabilities the request included (None: not asked;
        each text part then says `logprobs: []`)."""
        self.id = _id("resp")
        self._names = names
        self._streamed = streamed
        reasoning = body.reasoning
        effort = requested_effort(body)  # nested or at the top level (chat_request refused both before this)
        summary = reasoning.summary or reasoning.generate_summary if reasoning is not None else None
        # What the Response says of the request, written once (a Codex request's tools are ~18 KB).
        self._echo = {
            "id": self.id, "object": "response", "created_at": int(time.time()), "model": model,
            "parallel_tool_calls": body.parallel_tool_calls is not False, "tool_choice": _choice(body.tool_choice),
            # OpenAI's tools accepted and not offered are left out: the Response says what the model was offered.
            "tools": [t.model_dump(exclude_none=True) for t in body.tools or () if not isinstance(t, HostedTool)],
            "instructions": body.instructions, "metadata": body.metadata or {},
            "temperature": body.temperature, "top_p": body.top_p, "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": effort, "summary": summary} if reasoning is not None or effort is not None
            else None,
            "text": {"format": body.text.format.model_dump(by_alias=True, exclude_none=True)
                     if body.text is not None and body.text.format is not None else {"type": "text"},
                     "verbosity": "medium"},  # the only one offered (another is a 400)
            "truncation": "disabled", "store": body.store is not False,
            "background": False, "service_tier": "default", "user": body.user,
            "safety_identifier": body.safety_identifier, "prompt_cache_key": body.prompt_cache_key,
            "prompt_cache_retention": body.prompt_cache_retention,
            "top_logprobs": body.top_logprobs, "max_tool_calls": body.max_tool_calls,
        }
        self._max_output_tokens = body.max_output_tokens
        # The thinking goes in the reasoning item's summary (what the Vercel AI SDK, pydantic-ai and LangChain's
        # streams read) unless the request says summary "none", which puts it in `content`.
        self._summary = summary != "none"
        self._sealed = "reasoning.encrypted_content" in (body.include or ())
        self.thinking: list[str] = []  # the reasoning items' text, counted for usage when the reply ends
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item being written
        self._text: list[str] = []  # its text (a call's arguments)
        self._logprobs = logprobs
        self._tokens: list[TokenLogprob] = []  # the open message's tokens, when logprobs were included
        self._sequence = 0
        self.started = False  # response.created went out
        # The limit the server applied to a request that set none (--max-tokens-cap, the context's room): said in
        # the response, so an `incomplete` for max_output_tokens names a number the client can see.
        self.applied_limit: int | None = None

    # -- events ---------------------------------------------------------------------------------------------------

    def event(self, kind: str, **fields: Any) -> bytes:
        """One framed event. Raises nothing."""
        if not self._streamed:
            return b""
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return line_safe(f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n".encode())

    def opening(self) -> bytes:
        """response.created then response.in_progress, once; later calls an in_progress (a keep-alive Codex's idle
        timer counts, as it does not count SSE comments). Raises nothing."""
        if self.started:
            return self.event("response.in_progress", response=self.response("in_progress"))
        self.started = True
        return (self.event("response.created", response=self.response("in_progress"))
                + self.event("response.in_progress", response=self.response("in_progress")))

    def feed(self, delta: ChoiceDelta, tokens: Sequence[TokenLogprob] = ()) -> list[bytes]:
        """The events of one chat delta; `tokens`: those its content was written with (service/responses/
        text_logprobs.py), given when logprobs were included. Raises nothing."""
        events: list[bytes] = []
        if delta.reasoning_content:
            events += self._into("reasoning")
            events.append(self._text_delta(delta.reasoning_content))
        if delta.content:
            events += self._into("message")
            events.append(self._text_delta(delta.content, tokens))
        for call in delta.tool_calls or ():
            if call.id is not None:  # a call's first delta: its name
                events += self._close()
                events += self._open_call(call.index, call.id, call.function.name if call.function else None)
            if call.function is not None and call.function.arguments and self._open is not None \
                    and self._open.get("call") == call.index:
                if event := self._text_delta(call.function.arguments):
                    events.append(event)
        return events

    def close(self, incomplete: bool = False) -> list[bytes]:
        """Close the open item (an empty message when the reply said nothing). Raises nothing."""
        opened = self._into("message") if not self.items and self._open is None else []
        return opened + self._close("incomplete" if incomplete else "completed")

    def final(self, finish_reason: str, usage: dict[str, Any]) -> dict[str, Any]:
        """The finished Response: completed, or incomplete when max_output_tokens cut it. Raises nothing."""
        if finish_reason == "length":
            return self.response("incomplete", usage=usage, incomplete_details={"reason": "max_output_tokens"})
        return self.response("completed", usage=usage)

    def failed(self, error: APIError, usage: dict[str, Any] | None = None) -> bytes:
        """The open item closed as incomplete (what was said stays in the output), response.failed carrying the
        error's own code (request_timeout, …; Codex retries all but context_length_exceeded and invalid_prompt),
        then an `error` event as OpenAI sends one: the openai SDKs raise on it (on response.failed they do not, and
        pydantic-ai, llama-index and LangChain JS took the cut text for a whole reply). Raises nothing."""
        events = self._close("incomplete") if self.items or self._open is not None else []
        events.append(self.event("response.failed", response=self.response(
            "failed", usage=usage, error={"code": error.code, "message": error.message})))
        events.append(self.event("error", code=error.code, message=error.message, param=error.param,
                                 **error_body(error)))
        return b"".join(events)

    # -- the response object ---------------------------------------------------------------------------------------

    def response(self, status: str, *, usage: dict[str, Any] | None = None, error: dict[str, Any] | None = None,
                 incomplete_details: dict[str, Any] | None = None) -> dict[str, Any]:
        """The Response object as it stands (`usage` given at the end). Raises nothing."""
        return {
            **self._echo, "status": status, "completed_at": int(time.time()) if status == "completed" else None,
            "output": self._so_far() if status == "in_progress" else list(self.items),
            "error": error, "incomplete_details": incomplete_details,
            "max_output_tokens": self._max_output_tokens or self.applied_limit, "usage": usage,
        }

    def _so_far(self) -> list[dict[str, Any]]:
        """The items as a client following the events holds them (an in_progress snapshot, sent while the stream is
        quiet: a client replacing its snapshot loses nothing): the closed ones whole, the open one with what its
        deltas said (a custom call's input comes whole at its end). Raises nothing."""
        if self._open is None:
            return list(self.items)
        kind, index, item = self._open["type"], self._open["index"], self._open["item"]
        text = "".join(self._text)
        self._text = [text]  # joined once, not again at the next snapshot or the close
        if kind == "message":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": json.loads(
                self._logprobs.entries(self._tokens)) if self._logprobs is not None else []}
            item = {**item, "content": [part]}
        elif kind == "reasoning":
            item = {**item, "summary": [{"type": "summary_text", "text": text}]} if self._summary else \
                {**item, "content": [{"type": "reasoning_text", "text": text}]}
        elif kind == "function_call":
            item = {**item, "arguments": text}
        return [*self.items[:index], item, *self.items[index + 1:]]

    # -- items -----------------------------------------------------------------------------------------------------

    def _into(self, kind: str) -> list[bytes]:
        """Events opening an item of `kind` unless one is open (closing another first)."""
        if self._open is not None and self._open["type"] == kind:
            return []
        events = self._close()
        index = len(self.items)
        if kind == "reasoning":
            item: dict[str, Any] = {"id": _id("rs"), "type": "reasoning", "summary": []}
            if not self._summary:
                item["content"] = []
            self._open = {"type": kind, "index": index, "item": item}
            events.append(self.event("response.output_item.added", output_index=index, item=item))
            if self._summary:
                events.append(self._part("response.reasoning_summary_part.added", {"type": "summary_text", "text": ""}))
        else:
            item = {"id": _id("msg"), "type": "message", "role": "assistant", "status": "in_progress", "content": []}
            self._open = {"type": kind, "index": index, "item": item}
            events.append(self.event("response.output_item.added", output_index=index, item=item))
            events.append(self._part("response.content_part.added", {"type": "output_text", "text": "",
                                                                     "annotations": []}))
        self.items.append(item)
        return events

    def _open_call(self, call_index: int, call_id: str, name: str | None) -> list[bytes]:
        kind, own, namespace = self._names.item(name or "")
        index = len(self.items)
        if kind == "custom":
            item: dict[str, Any] = {"id": _id("ctc"), "type": "custom_tool_call", "status": "in_progress",
                                    "call_id": call_id, "name": own, "input": ""}
        else:
            item = {"id": _id("fc"), "type": "function_call", "status": "in_progress", "call_id": call_id,
                    "name": own, "arguments": ""}
            if namespace is not None:
                item["namespace"] = namespace
        self._open = {"type": item["type"], "index": index, "item": item, "call": call_index}
        self.items.append(item)
        return [self.event("response.output_item.added", output_index=index, item=item)]

    def _part(self, kind: str, part: dict[str, Any]) -> bytes:
        assert self._open is not None
        where = {"summary_index": 0} if self._open["type"] == "reasoning" else {"content_index": 0}
        return self.event(kind, item_id=self._open["item"]["id"], output_index=self._open["index"], **where,
                          part=part)

    def _text_delta(self, text: str, tokens: Sequence[TokenLogprob] = ()) -> bytes:
        """A text delta of the open item, framed around JSON written once per item (the hot path: one per token)."""
        assert self._open is not None
        self._text.append(text)
        if self._logprobs is not None:
            self._tokens += tokens
        if not self._streamed:
            return b""
        frame = self._open.get("frame")
        if frame is None:
            frame = self._open["frame"] = self._delta_frame()
        if frame is _NO_EVENT:
            return b""
        head, middle, tail = frame
        sequence = self._sequence
        self._sequence += 1
        if self._logprobs is not None and self._open["type"] == "message":  # this delta's own tokens
            tail = b',"logprobs":' + self._logprobs.entries(tokens) + b"}\n\n"
        return line_safe(b"".join((head, str(sequence).encode(), middle, json.dumps(text, ensure_ascii=False).encode(),
                                   tail)))

    def _delta_frame(self) -> tuple[bytes, bytes, bytes]:
        """The bytes before the sequence number, between it and the delta, and after the delta."""
        assert self._open is not None
        kind, item_id, index = self._open["type"], self._open["item"]["id"], self._open["index"]
        if kind == "custom_tool_call":
            return _NO_EVENT  # the input is inside the call's JSON: sent whole when the call ends
        where: dict[str, Any] = {"item_id": item_id, "output_index": index}
        tail = b"}\n\n"
        if kind == "message":
            event, where["content_index"], tail = "response.output_text.delta", 0, b',"logprobs":[]}\n\n'
        elif kind == "reasoning" and self._summary:
            event, where["summary_index"] = "response.reasoning_summary_text.delta", 0
        elif kind == "reasoning":
            event, where["content_index"] = "response.reasoning_text.delta", 0
        else:
            event = "response.function_call_arguments.delta"
        head = f'event: {event}\ndata: {{"type":"{event}","sequence_number":'.encode()
        middle = ("," + json.dumps(where, separators=(",", ":"))[1:-1] + ',"delta":').encode()
        return head, middle, tail

    def _close(self, status: str = "completed") -> list[bytes]:
        """Events closing the open item, whose final form replaces it in `items`."""
        if self._open is None:
            return []
        kind, index, item = self._open["type"], self._open["index"], self._open["item"]
        text, self._text, self._open = "".join(self._text), [], None
        item_id = item["id"]
        events: list[bytes] = []
        if kind == "message":
            logprobs = json.loads(self._logprobs.entries(self._tokens)) if self._logprobs is not None else []
            self._tokens = []
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
            events.append(self.event("response.output_text.done", item_id=item_id, output_index=index,
                                     content_index=0, text=text, logprobs=logprobs))
            events.append(self.event("response.content_part.done", item_id=item_id, output_index=index,
                                     content_index=0, part=part))
            item = {**item, "status": status, "content": [part]}
        elif kind == "reasoning":
            self.thinking.append(text)
            if self._summary:
                summary = {"type": "summary_text", "text": text}
                events.append(self.event("response.reasoning_summary_text.done", item_id=item_id,
                                         output_index=index, summary_index=0, text=text))
                events.append(self.event("response.reasoning_summary_part.done", item_id=item_id,
                                         output_index=index, summary_index=0, part=summary))
                item = {**item, "summary": [summary]}
            else:
                events.append(self.event("response.reasoning_text.done", item_id=item_id, output_index=index,
                                         content_index=0, text=text))
                item = {**item, "content": [{"type": "reasoning_text", "text": text}]}
            item["encrypted_content"] = seal_reasoning(text) if self._sealed else None
        elif kind == "custom_tool_call":
            item = {**item, "status": status, "input": _custom_input(text)}
            events.append(self.event("response.custom_tool_call_input.delta", item_id=item_id, output_index=index,
                                     delta=item["input"]))
            events.append(self.event("response.custom_tool_call_input.done", item_id=item_id, output_index=index,
                                     input=item["input"]))
        else:
            item = {**item, "status": status, "arguments": text}
            events.append(self.event("response.function_call_arguments.done", item_id=item_id, output_index=index,
                                     name=item["name"], arguments=text))  # OpenAI's event names the function
        self.items[index] = item
        events.append(self.event("response.output_item.done", output_index=index, item=item))
        return events


def _custom_input(arguments: str) -> str:
    """A custom tool's input: the string the model put in the `input` argument it was offered (the arguments as
    written when they are not that object; of a call max_tokens cut, the string as far as it was written). Raises
    nothing."""
    try:
        value = json.loads(arguments)
    except ValueError:
        try:
            value = from_json(arguments, allow_partial="trailing-strings")
        except ValueError:
            return arguments
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return value["input"]
    return arguments


def _choice(value: Any) -> Any:
    """The request's tool_choice as the Response echoes it (a named function as its object). Raises nothing."""
    return value if isinstance(value, str) else value.model_dump() if value is not None else "auto"
