"""A `<tool_call>` JSON call streamed while the model writes it.

Held whole until its closing marker, a call was silence for as long as the model wrote it (a 22 s write_to_file
came as one burst; a proxy's idle timeout cuts a longer one), while Cline, Roo Code and Zed show a call from its
streamed fragments and OpenAI and vLLM stream the name first, then the arguments. So once the open block reads
`{"name": "<a declared name>", "arguments":` the call is announced, then the arguments value's text goes out as the
model writes it. A small JSON scanner (strings, escapes, nesting) finds where that value ends, so nothing past it
(the outer `}`, whitespace, the closing marker) is ever sent; a block that opens any other way is left to the
family's parser at its end, as before.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable, Collection

from engine.call_end import JsonStrings
from engine.cut_calls import read_json_calls

__all__ = ["StreamedCall", "declared_names", "normalize_call", "streams_calls"]

log = logging.getLogger(__name__)

_WS = " \t\n\r"
_KEYS = ("arguments", "parameters")  # normalize_call reads either
_WAIT, _NO = "wait", "no"


def declared_names(tools: Any) -> frozenset[str]:
    """The function names of an OpenAI `tools` list (dicts). Raises nothing."""
    names = set()
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.add(function["name"])
    return frozenset(names)


def streams_calls(parser: Any, end: str | None) -> bool:
    """Whether calls of this family stream: `<tool_call>` JSON (mlx-lm's json_tools: Hermes, Qwen 2.5 and 3, models
    told their tools in the prompt), whose block has an end marker. Raises nothing."""
    return bool(end) and getattr(parser, "__module__", "").endswith("json_tools")


def normalize_call(call: Any) -> tuple[str, str]:
    """(name, arguments JSON text) from a parser's dict. Raises ValueError when it has no name."""
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        raise ValueError(f"tool call without a name: {call!r}")
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):
        json.loads(arguments)  # a parser that returns JSON text must return valid JSON
        return call["name"], arguments
    return call["name"], json.dumps(arguments, ensure_ascii=False)


def _string_end(text: str, at: int) -> int | None:
    """Where the JSON string opening at `at` ends (after its closing quote), None while it is open."""
    escaped = False
    for i in range(at + 1, len(text)):
        if escaped:
            escaped = False
        elif text[i] == "\\":
            escaped = True
        elif text[i] == '"':
            return i + 1
    return None


def _head(block: str, names: Collection[str]) -> tuple[str, int] | str:
    """(name, where the arguments value may begin) once `block` reads `{"name": "<one of names>", "arguments":`;
    _WAIT while it still may, _NO when it cannot (another key first, a name not declared, not an object)."""
    at, name = 0, ""
    for slot, part in enumerate(("{", ("name",), ":", names, ",", _KEYS, ":")):
        while at < len(block) and block[at] in _WS:
            at += 1
        if at == len(block):
            return _WAIT
        if isinstance(part, str):
            if block[at] != part:
                return _NO
            at += 1
            continue
        if block[at] != '"':
            return _NO
        if (end := _string_end(block, at)) is None:
            return _WAIT
        try:
            value = json.loads(block[at:end])
        except ValueError:
            return _NO
        if value not in part:
            return _NO
        name = value if slot == 3 else name
        at = end
    return name, at


class StreamedCall:
    """One open call block read as it grows (`grow`), then closed (`close`). `index`: the call's index in the reply
    once announced."""

    def __init__(self, names: Collection[str], index: int) -> None:
        self._names = names
        self.index = index
        self.name: str | None = None  # announced
        self._failed = False  # the block is not one that streams: the parser reads it whole at its end
        self._pos = 0  # block text scanned so far
        self._start = -1  # where the arguments value begins
        self._end: int | None = None  # where it ends (exclusive)
        self._depth, self._strings = 0, JsonStrings()
        self._sent = 0  # characters of the value sent
        self._streams = True  # false for arguments written as a JSON string: sent decoded, at the close

    def grow(self, block: str, hold: int) -> tuple[str | None, str]:
        """(the name, when `block` — the block's text so far — announces the call now; the arguments' text newly
        written), never the last `hold` characters (they may begin the closing marker). Raises nothing."""
        announced = None
        if self.name is None:
            head = _head(block, self._names) if not self._failed else _NO
            if not isinstance(head, tuple):
                self._failed = head == _NO
                return None, ""
            announced, self._pos = head
            self.name = announced
        self._scan(block)
        if not self._streams or self._start < 0:
            return announced, ""
        upto = min(len(block) - hold, self._end if self._end is not None else len(block))
        fragment = block[self._start + self._sent:upto]
        self._sent += len(fragment)
        return announced, fragment

    def close(self, block: str, parse: Callable[[str, Any], Any], tools: Any,
              cut: bool) -> tuple[str, list[tuple[str, str]]]:
        """(the rest of the announced call's arguments, then the (name, arguments) of any further calls the block
        holds) for its whole text. The arguments are the value as written when the block parses; otherwise — bad
        JSON, or `cut` by the token limit — as far as it was written (OpenAI warns arguments may not be valid JSON).
        What was sent is always their beginning. Raises nothing."""
        self._scan(block)
        value = block[self._start:self._end] if self._start >= 0 else ""
        sent = value[:self._sent]
        try:
            _, parsed = normalize_call(parse(block, tools))
        except Exception:  # noqa: BLE001 — parsers raise anything from ValueError to KeyError
            log.info("a streamed tool call's block does not parse: its arguments as written (%r)", block[:80])
            more = read_json_calls(block.strip()) if self._end is not None else None
            # objects after the first (whole[0], once more than one was written): calls too, the last one cut or not
            further = [*more.whole[1:], *([more.cut] if more.cut and more.whole and cut else [])] if more else []
            calls = []
            for call in further:
                try:
                    calls.append(call if isinstance(call, tuple) else normalize_call(call))
                except ValueError:
                    pass
            return value[len(sent):].rstrip(), calls
        return (value if self._streams else parsed)[len(sent):], []

    def _scan(self, block: str) -> None:
        """Read on to the arguments value's end: its first non-space character begins it; a string, object or list
        ends where it closes, a bare number or word at the next space, comma or bracket."""
        i = self._pos
        while self._end is None and i < len(block):
            ch = block[i]
            i += 1
            if self._start < 0:
                if ch in _WS:
                    continue
                self._start, self._streams = i - 1, ch != '"'
            opened = self._strings.inside
            if self._strings.read(ch):
                if opened and not self._strings.inside:  # the string closed
                    self._end = i if self._depth == 0 else None
            elif ch in "{[":
                self._depth += 1
            elif self._depth == 0 and (ch in _WS or ch in ",}]"):
                self._end = i - 1
            elif ch in "}]":
                self._depth -= 1
                self._end = i if self._depth == 0 else None
        self._pos = i
