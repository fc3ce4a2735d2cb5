"""Split a streamed chat reply into content, reasoning and tool calls.

The splitter is fed decoded text deltas (special marker tokens included) and emits ordered events.
Reasoning lies between the model's think markers; tool calls between its tool-call markers and are
parsed with mlx-lm's parser for the model family. Text that might be the start of a marker is held
back until it can no longer be one, so no marker or tool-call block reaches content — unless the block cannot
be parsed (bad JSON): then it is content as the model wrote it, never an empty answer. A block the token limit cut
is a call that was cut (engine/cut_calls.py): a call with the arguments written so far, or left out, never markup.
A `<tool_call>` JSON call to a declared function streams as it is written (engine/streamed_call.py): its name once
read, then its arguments' text; other families' calls come whole when their block ends.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, replace
from typing import Any, Callable, Literal, Sequence, Union

from engine.call_end import CallEnd
from engine.cut_calls import read_cut_block
from engine.streamed_call import StreamedCall, declared_names, normalize_call, streams_calls

__all__ = [
    "OutputMarkers",
    "ContentText",
    "ReasoningText",
    "ToolCallStart",
    "ToolCallArguments",
    "OutputEvent",
    "ChatOutputSplitter",
    "starts_in_reasoning",
    "opens_reasoning",
    "held_suffix",
    "fresh_call_id",
    "BufferedSplitter",
    "normalize_call",
]

log = logging.getLogger(__name__)

ToolParser = Callable[[str, Any], Any]


@dataclass(frozen=True)
class OutputMarkers:
    """The model family's markers. An empty tool_call_end means a call runs to the end of the reply."""

    think_start: str | None = None
    think_end: str | None = None
    tool_call_start: str | None = None
    tool_call_end: str | None = None
    tool_parser: ToolParser | None = None

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> "OutputMarkers":
        """Markers of an mlx-lm TokenizerWrapper (any object lacking them gives no markers). Never raises."""
        think_start = getattr(tokenizer, "think_start", None)
        think_end = getattr(tokenizer, "think_end", None)
        if not (think_start and think_end):
            from engine.think_markers import fallback_think_markers

            think_start, think_end = fallback_think_markers(tokenizer) or (None, None)
        parser = getattr(tokenizer, "tool_parser", None)
        tool_start = getattr(tokenizer, "tool_call_start", None) if parser is not None else None
        tool_end = getattr(tokenizer, "tool_call_end", None) if parser is not None else None
        if parser is None:
            from engine.tool_formats import fallback_tool_format

            if (found := fallback_tool_format(tokenizer)) is not None:  # a format mlx-lm does not infer
                parser, tool_start, tool_end = found.parse, found.start, found.end
        return cls(
            think_start=think_start if think_start and think_end else None,
            think_end=think_end if think_start and think_end else None,
            tool_call_start=tool_start or None,
            tool_call_end=tool_end if tool_start else None,
            tool_parser=parser if tool_start else None,
        )

    @property
    def has_thinking(self) -> bool:
        return self.think_start is not None

    def with_json_tool_calls(self) -> "OutputMarkers":
        """These markers with tool calls as <tool_call> JSON (mlx-lm's json_tools parser): for a model told of its
        tools in the prompt because its chat template takes none. Raises nothing."""
        from mlx_lm.tool_parsers import json_tools

        return replace(self, tool_call_start=json_tools.tool_call_start, tool_call_end=json_tools.tool_call_end,
                       tool_parser=json_tools.parse_tool_call)

    def without_tool_calls(self) -> "OutputMarkers":
        """These markers with no tool calls: what would be one is content (tool_choice "none"). Raises nothing."""
        return replace(self, tool_call_start=None, tool_call_end=None, tool_parser=None)


def opens_reasoning(tokenizer: Any, generation_prompt: str) -> bool:
    """True when the template's generation prompt (the text it appends to open the reply) leaves a think block
    open, as a template with thinking switched on does. Only that text counts: a conversation that mentions the
    markers opens nothing. Never raises."""
    start = getattr(tokenizer, "think_start", None)
    end = getattr(tokenizer, "think_end", None)
    if not start or not end:
        return False
    return generation_prompt.rfind(start) > generation_prompt.rfind(end)


def starts_in_reasoning(tokenizer: Any, prompt_tokens: Sequence[int]) -> bool:
    """True when the prompt ends inside an open think block (a template with thinking switched on). For templates
    whose generation prompt cannot be told apart (`opens_reasoning` is the rule otherwise): markers the
    conversation itself writes near its end count too.

    Looks at the last 16 tokens only, where templates open the block. Never raises.
    """
    start = getattr(tokenizer, "think_start_tokens", None)
    end = getattr(tokenizer, "think_end_tokens", None)
    if not start or not end:
        return False
    tail = list(prompt_tokens[-16:])

    def rfind(seq: Sequence[int]) -> int:
        n = len(seq)
        for i in range(len(tail) - n, -1, -1):
            if tuple(tail[i : i + n]) == tuple(seq):
                return i
        return -1

    return rfind(start) > rfind(end)


@dataclass(frozen=True)
class ContentText:
    text: str
    kind: Literal["content"] = "content"


@dataclass(frozen=True)
class ReasoningText:
    text: str
    kind: Literal["reasoning"] = "reasoning"


@dataclass(frozen=True)
class ToolCallStart:
    """First event of a tool call: its stable index in the reply, id and function name."""

    index: int
    id: str
    name: str
    kind: Literal["tool_call_start"] = "tool_call_start"


@dataclass(frozen=True)
class ToolCallArguments:
    """A fragment of the call's arguments as JSON text; fragments of one index concatenate. `last`: the call ends
    with it (false while a streamed call's arguments are still being written)."""

    index: int
    arguments: str
    last: bool = True
    kind: Literal["tool_call_arguments"] = "tool_call_arguments"


OutputEvent = Union[ContentText, ReasoningText, ToolCallStart, ToolCallArguments]

_State = Literal["content", "reasoning", "tool"]


def held_suffix(text: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of text that is a proper prefix of some marker."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


def fresh_call_id() -> str:
    """A fresh tool-call id in OpenAI's shape (`call_` and 24 hex digits). Raises nothing."""
    return f"call_{uuid.uuid4().hex[:24]}"


class BufferedSplitter:
    """A splitter that reads its text from a buffer one transition at a time: feed() appends a delta and runs
    `_step` until it can go no further; subclasses keep what they hold back in `_buffer`."""

    _buffer: str

    def feed(self, text: str) -> list[OutputEvent]:
        """Consume a text delta; return the events it completes. Never raises."""
        self._buffer += text
        events: list[OutputEvent] = []
        while self._step(events):
            pass
        return events

    def _step(self, events: list[OutputEvent]) -> bool:
        """One transition (or a final partial emit); True while more may follow."""
        raise NotImplementedError


class ChatOutputSplitter(BufferedSplitter):
    """Streaming splitter of one reply; feed() deltas in order, then finish() once."""

    def __init__(
        self,
        markers: OutputMarkers,
        *,
        tools: Any = None,
        in_reasoning: bool = False,
        new_call_id: Callable[[], str] | None = None,
        forced_name: str | None = None,
    ) -> None:
        self._m = markers
        self._tools = tools
        self._forced_name = forced_name  # the name every call must have (a forced call of one function)
        self._state: _State = "reasoning" if in_reasoning and markers.has_thinking else "content"
        self._buffer = ""
        self._strip_leading = False
        self._reasoning_opened = self._state == "reasoning"
        self._new_call_id = new_call_id or fresh_call_id
        # Calls of a family that streams them, to these functions, go out as written; None: each comes whole.
        names = declared_names(tools) if streams_calls(markers.tool_parser, markers.tool_call_end) else frozenset()
        self._streamed_names = names or None
        self._call: StreamedCall | None = None  # the open block's, where calls stream
        self._end: CallEnd | None = None  # the open <tool_call> JSON block's end, found outside its strings
        self.tool_calls = 0
        self.unparsed_tool_text: list[str] = []

    def finish(self, cut: bool = False) -> list[OutputEvent]:
        """Flush held text at the end of the reply; an unterminated tool call is parsed, or content. `cut`: the token
        limit ended the reply, so an unterminated call that does not parse was cut: the part of it that can be read
        (read_cut_block), never its markup. Never raises."""
        events: list[OutputEvent] = []
        rest, self._buffer = self._buffer, ""
        start = self._m.tool_call_start
        if self._state == "tool":
            # A reply cut off inside the end marker (`…}\n</tool`): the call is whole, as without that part.
            end = self._held_end(rest)
            self._close_block(rest[: len(rest) - end], events, closed=False, written=rest, cut=cut)
        elif self._state == "reasoning":
            self._emit_reasoning(rest, events)
        elif not (cut and start and self._m.tool_parser is not None and start.startswith(rest)):
            self._emit_content(rest, events)  # (held text the limit cut inside a call's opening marker is markup)
        self._state, self._end = "content", None
        return events

    # One transition (or a final partial emit) per call; True while more may follow.
    def _step(self, events: list[OutputEvent]) -> bool:
        m, buf = self._m, self._buffer
        if self._state == "tool":
            if not m.tool_call_end:
                return False
            i = self._end.find(buf) if self._end is not None else buf.find(m.tool_call_end)
            if i < 0:
                if self._call is not None:
                    self._grow_call(buf, events)
                return False
            self._buffer = buf[i + len(m.tool_call_end) :]
            parsed = self._close_block(buf[:i], events, closed=True)
            self._state, self._strip_leading, self._end = "content", parsed, None
            return True
        if self._state == "reasoning":
            assert m.think_end is not None
            i = buf.find(m.think_end)
            if i < 0:
                # Hold a partial end marker and trailing newlines (layout if the block ends next).
                keep = held_suffix(buf, [m.think_end])
                emit = buf[: len(buf) - keep].rstrip("\n")
                self._emit_reasoning(emit, events)
                self._buffer = buf[len(emit) :]
                return False
            self._emit_reasoning(buf[:i].rstrip("\n"), events)
            self._buffer = buf[i + len(m.think_end) :]
            self._state, self._strip_leading = "content", True
            return True
        starts = [(buf.find(s), s, st) for s, st in self._content_exits() if s in buf]
        if starts:
            i, marker, state = min(starts, key=lambda x: x[0])
            self._emit_content(buf[:i], events)
            self._buffer = buf[i + len(marker) :]
            self._state = state
            self._reasoning_opened = state == "reasoning"
            if state == "tool" and self._streamed_names is not None:
                self._call = StreamedCall(self._streamed_names, self.tool_calls)
            if state == "tool" and m.tool_call_end and streams_calls(m.tool_parser, m.tool_call_end):
                self._end = CallEnd(m.tool_call_end)
            return True
        keep = held_suffix(buf, [s for s, _ in self._content_exits()])
        self._emit_content(buf[: len(buf) - keep], events)
        self._buffer = buf[len(buf) - keep :]
        return False

    def _content_exits(self) -> list[tuple[str, _State]]:
        exits: list[tuple[str, _State]] = []
        if self._m.think_start:
            exits.append((self._m.think_start, "reasoning"))
        if self._m.tool_call_start and self._m.tool_parser is not None:
            exits.append((self._m.tool_call_start, "tool"))
        return exits

    def _emit_reasoning(self, text: str, events: list[OutputEvent]) -> None:
        # Templates write `<think>\n...\n</think>`: those newlines are layout, not thinking.
        if self._reasoning_opened:
            text = text.lstrip("\n")
            if not text:
                return
            self._reasoning_opened = False
        if text:
            events.append(ReasoningText(text))

    def _emit_content(self, text: str, events: list[OutputEvent]) -> None:
        # Whitespace right after a think block or a tool call is layout, not an answer.
        if self._strip_leading:
            text = text.lstrip()
            if not text:
                return
            self._strip_leading = False
        if text:
            events.append(ContentText(text))

    def _grow_call(self, block: str, events: list[OutputEvent]) -> None:
        """The open block's streamed call: its start once its name is read, then its arguments as written."""
        assert self._call is not None and self._m.tool_call_end
        name, fragment = self._call.grow(block, self._held_end(block))
        if name is not None:
            self.tool_calls += 1
            events.append(ToolCallStart(self._call.index, self._new_call_id(), name))
        if fragment:
            events.append(ToolCallArguments(self._call.index, fragment, last=False))

    def _held_end(self, block: str) -> int:
        """How many of the open block's last characters may begin its end marker (a <tool_call> JSON block's: only
        outside its strings, as its last `find` saw it). Raises nothing."""
        if self._end is not None:
            return self._end.held(block)
        return held_suffix(block, [self._m.tool_call_end]) if self._m.tool_call_end else 0

    def _close_block(self, block: str, events: list[OutputEvent], closed: bool, written: str | None = None,
                     cut: bool = False) -> bool:
        """The events ending a call block (see _emit_tool_calls); a streamed call stays a call. Returns whether the
        block was calls."""
        call = self._call
        if call is not None and call.name is None:
            self._grow_call(block, events)  # the block's last text may be what announces it
        self._call = None
        if call is None or call.name is None:
            return self._emit_tool_calls(block, events, closed, written, cut)
        assert self._m.tool_parser is not None
        rest, further = call.close(block, self._m.tool_parser, self._tools, cut)
        events.append(ToolCallArguments(call.index, rest))
        for name, arguments in further:
            self._emit_call(name, arguments, events)
        return True

    def _emit_tool_calls(self, block: str, events: list[OutputEvent], closed: bool, written: str | None = None,
                         cut: bool = False) -> bool:
        """Tool-call events for `block`, or the block as content (`written`: the text the model wrote for it, when
        the block left part out; `cut`: the token limit cut the block, read as far as it goes); returns whether it
        parsed."""
        m = self._m
        try:
            parsed = m.tool_parser(block, self._tools) if m.tool_parser is not None else None
            calls = parsed if isinstance(parsed, list) else [parsed]
            normalized = [normalize_call(c) for c in calls]
        except Exception as exc:  # parsers raise anything from ValueError to KeyError
            self.unparsed_tool_text.append(block)
            if cut:
                self._emit_cut_calls(block, events)
                return False
            log.info("a tool call that does not parse is content (%s: %s)", type(exc).__name__, exc)
            self._strip_leading = False
            text = block if written is None else written
            self._emit_content(f"{m.tool_call_start or ''}{text}{m.tool_call_end or '' if closed else ''}", events)
            return False
        for name, arguments in normalized:
            self._emit_call(name, arguments, events)
        return True

    def _emit_cut_calls(self, block: str, events: list[OutputEvent]) -> None:
        """The calls of a block the token limit cut: those it finished, then the cut one with its arguments so far;
        none when the cut one's name cannot be read (the reply ends with what was said before it)."""
        read = read_cut_block(block, self._m.tool_parser, self._tools, self._forced_name)
        try:
            whole = [normalize_call(call) for call in read.whole]
        except ValueError:
            whole = []
        if read.cut is None:
            log.info("a tool call cut by the token limit before its name is left out: %r", block[:80])
        for name, arguments in [*whole, *([read.cut] if read.cut is not None else [])]:
            self._emit_call(name, arguments, events)

    def _emit_call(self, name: str, arguments: str, events: list[OutputEvent]) -> None:
        index = self.tool_calls
        self.tool_calls += 1
        events.append(ToolCallStart(index, self._new_call_id(), name))
        events.append(ToolCallArguments(index, arguments))

