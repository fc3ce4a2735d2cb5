"""A tool call cut off by the token limit: what of it can be read.

A reply that max_tokens ends inside a call's block is a call that was cut, not an answer. OpenAI returns such a call
with the arguments written so far (not valid JSON) and finish_reason "length"; Anthropic an incomplete tool_use
block with stop_reason "max_tokens". As content, the family's markup reached users and went back to the model as an
assistant turn. The call's name is read from the block — `"name": "add"` of calls written as JSON, or the family's
parser over a block of tags (Qwen3-Coder's `<function=add>`, MiniMax's `<invoke name="add">`) once its open tags are
closed — or is the one a forced call must have (tool_choice naming a function).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from pydantic_core import from_json

__all__ = ["CutBlock", "read_cut_block", "read_json_calls"]

_ARGUMENT_KEYS = ("arguments", "parameters")
# An XML-like tag as the tag-writing families write them: `<function=add>`, `<parameter name="a">`, `</arg_value>`.
_TAG = re.compile(r"<(/?)([A-Za-z_][\w:.-]*)([^<>]*)>")
_NESTING = 3  # the most tags a family nests around a value (MiniMax: invoke, parameter): the ones closed


@dataclass(frozen=True)
class CutBlock:
    """A cut block's calls: `whole`, the parser-shaped dicts ({"name", "arguments"}) of calls it finished before the
    cut (a JSON list's first ones); `cut`, the cut call's name and arguments as written so far (None: no name)."""

    whole: list[Any] = field(default_factory=list)
    cut: tuple[str, str] | None = None


def read_cut_block(block: str, parse: Callable[[str, Any], Any] | None, tools: Any = None,
                   forced_name: str | None = None) -> CutBlock:
    """What can be read of a call block the token limit cut (the text after its opening marker). Raises nothing."""
    text = block.strip()
    if not text or text[0] in "{[":
        return read_json_calls(text, forced_name)
    if parse is None:
        return CutBlock()
    read = _tagged(block, parse, tools)
    read = read if read.cut is not None else _headed(text, parse, tools)
    # The parsers are run on text they were not written for: a name no declared tool has is misread markup.
    return read if read.cut is not None and (not tools or read.cut[0] in _declared(tools)) else CutBlock()


def read_json_calls(text: str, forced_name: str | None = None) -> CutBlock:
    """Calls written as JSON — one object, a list of them, or objects one after another (Llama's `;`) — whose last
    the limit cut: its name once written whole (else `forced_name`), its arguments the text after their key. Raises
    nothing."""
    starts = _object_starts(text)
    if not starts:
        return CutBlock(cut=(forced_name, "") if forced_name else None)
    whole: list[Any] = []
    for start, end in zip(starts, starts[1:]):
        try:
            whole.append(json.loads(text[start:end].rstrip().rstrip(",;").rstrip()))
        except ValueError:
            return CutBlock()  # a call before the cut one that does not parse: not calls as we know them
    last = text[starts[-1]:].rstrip()
    try:
        return CutBlock(whole + [json.loads(last)])  # the last call was whole too (a list's `]` was cut)
    except ValueError:
        pass
    try:
        partial = from_json(last, allow_partial=True)  # an unfinished name string is left out
    except ValueError:
        partial = None
    name = partial.get("name") if isinstance(partial, dict) else None
    name = name if isinstance(name, str) and name else forced_name
    return CutBlock(whole, (name, _arguments_text(last)) if name else None)


def _declared(tools: Any) -> set[str]:
    functions = [tool.get("function") for tool in tools if isinstance(tool, dict)]
    return {str(function.get("name")) for function in functions if isinstance(function, dict)}


def _walk(text: str) -> Iterator[tuple[int, str, int]]:
    """(index, character, depth before it) of each character of JSON text outside its strings, and of each string's
    closing quote (as '"' at its depth, so a caller can tell a key)."""
    depth, in_string, escaped = 0, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                yield i, '"', depth
            continue
        if ch == '"':
            in_string = True
            continue
        yield i, ch, depth
        depth += 1 if ch in "{[" else -1 if ch in "}]" else 0


def _object_starts(text: str) -> list[int]:
    """Where each call object begins: at the top level, or one level into a list that opens the text."""
    listed = text.startswith("[")
    return [i for i, ch, depth in _walk(text) if ch == "{" and depth == (1 if listed else 0)]


def _arguments_text(call: str) -> str:
    """The text written of a call object's arguments (after `"arguments":`; "" before they start)."""
    key_end, value_start = -1, -1
    for i, ch, depth in _walk(call):
        if value_start < 0:
            if ch == '"' and depth == 1:
                key_end = i
            elif ch == ":" and depth == 1 and key_end > 0 and not call[key_end + 1:i].strip():
                opened = call.rfind('"', 0, key_end)
                if call[opened + 1:key_end] in _ARGUMENT_KEYS:
                    value_start = i + 1
        elif depth == 1 and ch in ",}":
            return call[value_start:i].strip()
    return call[value_start:].strip() if value_start >= 0 else ""


def _headed(text: str, parse: Callable[[str, Any], Any], tools: Any) -> CutBlock:
    """A call written as a header then JSON arguments (Mistral's `add[ARGS]{...`): the family's parser reads the name
    from the block with the arguments the cut left open written as `{}`; they are the text from their `{` on."""
    start = text.find("{")
    while start >= 0 and (end := _value_end(text, start)) is not None:  # a call's arguments that closed: the next
        start = text.find("{", end)
    if start < 0 and "{" in text:
        return CutBlock()  # every object closed: no arguments the cut left open
    start = len(text) if start < 0 else start  # none: cut before the arguments
    try:
        parsed = parse(text[:start] + "{}", tools)
        calls = parsed if isinstance(parsed, list) else [parsed]
        name = calls[-1]["name"]
    except Exception:  # noqa: BLE001 — parsers raise anything from ValueError to KeyError
        return CutBlock()
    return CutBlock(calls[:-1], (name, text[start:])) if isinstance(name, str) and name else CutBlock()


def _value_end(text: str, start: int) -> int | None:
    """Where the JSON object opening at `start` ends, or None when it is still open where the text ends."""
    for i, ch, depth in _walk(text[start:]):
        if ch == "}" and depth == 1:
            return start + i + 1
    return None


def _tagged(block: str, parse: Callable[[str, Any], Any], tools: Any) -> CutBlock:
    """A block of tags read by the family's parser once the tags the cut left open are closed; the arguments so far as
    JSON without its end (a string value the cut came inside left open too). Only the outermost open tags are closed
    (a call's, a parameter's): one opened inside a value (`List<String`) is the value's text. Raises nothing."""
    text = block[: i] if (i := block.rfind("<")) >= 0 and ">" not in block[i:] else block  # a tag the cut split
    events = [(closing == "/", name) for closing, name, rest in _TAG.findall(text) if not rest.rstrip().endswith("/")]
    opened: list[str] = []
    for closing, name in events:
        if not closing:
            opened.append(name)
        elif name in opened:
            del opened[len(opened) - 1 - opened[::-1].index(name):]
    best: tuple[int, list[Any], str, dict[str, Any]] | None = None
    for k in range(1, min(len(opened), _NESTING) + 1):
        try:
            parsed = parse(text + "".join(f"</{name}>" for name in reversed(opened[:k])), tools)
            calls = parsed if isinstance(parsed, list) else [parsed]
            name, arguments = calls[-1]["name"], calls[-1].get("arguments", {})
        except Exception:  # noqa: BLE001 — parsers raise anything from ValueError to KeyError: not these closers
            continue
        if isinstance(name, str) and name and isinstance(arguments, dict) and (
                best is None or len(arguments) > len(best[3])):
            best = (k, calls, name, arguments)
    if best is None:
        return CutBlock()
    k, calls, name, arguments = best
    written = json.dumps(arguments, ensure_ascii=False)[:-1]
    closed = set(opened[:k])
    inside = next((not closing for closing, tag in reversed(events) if tag in closed), False)
    if inside and arguments and isinstance(list(arguments.values())[-1], str):
        written = written[:-1]  # cut inside a string value (its tag still open): its closing quote was never written
    return CutBlock(calls[:-1], (name, written))
