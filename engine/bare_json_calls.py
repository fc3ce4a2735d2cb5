"""Tool calls written as bare JSON, as Llama 3.1–3.3 Instruct write them.

Their chat templates ask for `{"name": function name, "parameters": dictionary of argument name and its value}`
with no tags around it (Llama 3.1 may put `<|python_tag|>` first; several calls come separated by `;`). mlx-lm
has no parser for this, so such a call reached the client as content and an agent never saw it. A reply that
starts with `{` is held until it ends; if it is one or more objects naming a declared tool it becomes tool calls,
otherwise it is content exactly as written (a JSON answer stays an answer).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Collection

from engine.chat_output import ContentText, OutputEvent, ToolCallArguments, ToolCallStart, fresh_call_id, normalize_call
from engine.cut_calls import read_json_calls
from engine.streamed_call import declared_names

__all__ = ["BareJsonCallSplitter", "parse_bare_calls", "declared_names", "writes_bare_json_calls"]

PYTHON_TAG = "<|python_tag|>"
_CALL_KEYS = frozenset({"name", "parameters", "arguments", "type"})
# What Llama 3.1–3.3's templates tell the model (their calls and results are rendered as this JSON too).
_LLAMA3_ASK = '"parameters": dictionary of argument name and its value'



def parse_bare_calls(text: str, tool_names: Collection[str]) -> list[tuple[str, str]] | None:
    """(name, arguments JSON) of each call in `text`, or None when it is not wholly calls to `tool_names`. Raises
    nothing."""
    decoder = json.JSONDecoder()
    rest = text.strip().removeprefix(PYTHON_TAG).strip()
    calls: list[tuple[str, str]] = []
    while rest:
        try:
            obj, end = decoder.raw_decode(rest)
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict) or not set(obj) <= _CALL_KEYS or obj.get("name") not in tool_names:
            return None
        arguments = obj.get("parameters", obj.get("arguments", {}))
        if isinstance(arguments, str):  # some write the arguments as JSON text
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return None
        if not isinstance(arguments, dict):
            return None
        calls.append((obj["name"], json.dumps(arguments, ensure_ascii=False)))
        rest = rest[end:].lstrip().lstrip(";").lstrip().removeprefix(PYTHON_TAG).lstrip()
    return calls or None


class BareJsonCallSplitter:
    """Streaming splitter of one reply (the engine/chat_output.py Splitter interface) for a model that writes
    calls as bare JSON. Text that does not open with `{` (or the python tag) streams as content at once."""

    def __init__(self, tool_names: Collection[str], *, new_call_id: Callable[[], str] | None = None) -> None:
        self._names = frozenset(tool_names)
        self._new_call_id = new_call_id or fresh_call_id
        self._state = "undecided"
        self._buffer = ""

    def feed(self, text: str) -> list[OutputEvent]:
        """Consume a text delta; return the events it completes. Never raises."""
        if self._state == "content":
            return [ContentText(text)] if text else []
        self._buffer += text
        if self._state == "undecided":
            head = self._buffer.lstrip()
            if not head or PYTHON_TAG.startswith(head):
                return []
            self._state = "call" if head.startswith(("{", PYTHON_TAG)) else "content"
            if self._state == "content":
                out, self._buffer = self._buffer, ""
                return [ContentText(out)]
        return []  # a call is read whole at the end: its JSON must parse

    def finish(self, cut: bool = False) -> list[OutputEvent]:
        """The held reply as calls, or as content when it is not wholly calls. `cut`: the token limit ended the
        reply, so calls whose last was cut are calls, that one with the arguments written so far — when it names a
        declared tool: JSON whose name was not written may be an answer, content as written. Never raises."""
        text, self._buffer = self._buffer, ""
        self._state = "content"
        calls = parse_bare_calls(text, self._names) if text.strip() else None
        if calls is None and cut:
            calls = self._cut_calls(text)
        if calls is None:
            return [ContentText(text)] if text else []
        events: list[OutputEvent] = []
        for index, (name, arguments) in enumerate(calls):
            events.append(ToolCallStart(index, self._new_call_id(), name))
            events.append(ToolCallArguments(index, arguments))
        return events

    def _cut_calls(self, text: str) -> list[tuple[str, str]] | None:
        read = read_json_calls(text.replace(PYTHON_TAG, " ").strip())
        try:
            calls = [normalize_call(call) for call in read.whole] + ([read.cut] if read.cut is not None else [])
        except ValueError:
            return None
        return calls if read.cut is not None and all(name in self._names for name, _ in calls) else None


def writes_bare_json_calls(template_sources: Collection[str] | None) -> bool:
    """True for a chat template that asks for calls in Llama 3's bare JSON format. Raises nothing."""
    return bool(template_sources) and any(_LLAMA3_ASK in text for text in template_sources or ())
