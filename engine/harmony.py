"""OpenAI's harmony reply format (gpt-oss): content, reasoning and tool calls from its channels.

A harmony reply is a run of messages. Each has a header — the role, a recipient (`to=functions.NAME` for a tool
call), `<|channel|>` and its name (analysis, commentary, final), a content type (`<|constrain|>json`) — then
`<|message|>` and a body ended by `<|end|>` (more messages follow), `<|call|>` (a tool call: the reply stops) or
`<|return|>` (the answer is done). The analysis channel, and commentary without a recipient (a preamble before a
call), are reasoning; final is content; a message to a recipient is a tool call whose arguments are its body.
mlx-lm has no parser for it: without this the bare channel names ("analysisThe user asks…assistantfinal…", the
markers being special tokens left out) reached `content`, and no tool call was ever parsed.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Callable, Literal

from engine.chat_output import (BufferedSplitter, ContentText, OutputEvent, ReasoningText, ToolCallArguments,
                                ToolCallStart, fresh_call_id, held_suffix)
from engine.per_tokenizer import PerTokenizer

__all__ = ["MARKER_TEXTS", "STOP_TEXTS", "is_harmony", "add_harmony_stops", "HarmonySplitter"]

log = logging.getLogger(__name__)

START, END, MESSAGE, CHANNEL, CONSTRAIN = "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>"
CALL, RETURN = "<|call|>", "<|return|>"
# The markers a reply's text must keep for the splitter to read (engine/special_tokens.py leaves them in).
MARKER_TEXTS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, CALL, RETURN)
# Each ends a harmony turn; a checkpoint whose config names only <|return|> would otherwise run past a call.
STOP_TEXTS = (RETURN, CALL)
_BODY_ENDS = (END, CALL, RETURN, START, CHANNEL)
# A header is one short line; text that grows past this without `<|message|>` is not one (a reply off-format).
_MAX_HEADER = 256
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")

_Route = Literal["content", "reasoning", "tool"]


def is_harmony(tokenizer: Any) -> bool:
    """True when the tokenizer's vocabulary has harmony's message markers (gpt-oss's o200k_harmony); found once per
    tokenizer (listing a vocabulary takes milliseconds, and every chat request asks). Raises nothing."""
    return _HARMONY.get(tokenizer)


def _has_markers(tokenizer: Any) -> bool:
    try:
        vocab = tokenizer.get_vocab()
        return all(marker in vocab for marker in (START, END, MESSAGE, CHANNEL))
    except Exception:  # noqa: BLE001 — a tokenizer that cannot list its vocabulary is not harmony's
        return False


_HARMONY = PerTokenizer(_has_markers)


def add_harmony_stops(tokenizer: Any) -> None:
    """Make <|return|> and <|call|> end a reply of a harmony tokenizer (as its generation_config does, which not
    every conversion keeps). Does nothing for other tokenizers. Raises nothing."""
    if not is_harmony(tokenizer):
        return
    try:
        vocab = tokenizer.get_vocab()
        stops = {int(vocab[text]) for text in STOP_TEXTS if text in vocab}
        tokenizer.eos_token_ids = set(getattr(tokenizer, "eos_token_ids", None) or ()) | stops
    except Exception as exc:  # noqa: BLE001 — a wrapper that refuses the attribute keeps its own stops
        log.warning("could not add harmony's stop tokens: %s", exc)


class HarmonySplitter(BufferedSplitter):
    """Streaming splitter of one harmony reply (the engine/chat_output.py Splitter interface): feed() text
    deltas in order, then finish() once. `calls` false (tool_choice "none"): a message to a recipient is
    content. `opening`: the template's generation prompt (`<|start|>assistant`), where the first header began, or the
    continued turn (an assistant prefill) with its body's text so far."""

    def __init__(self, *, tools: Any = None, calls: bool = True, opening: str | None = None,
                 new_call_id: Callable[[], str] | None = None) -> None:
        del tools  # harmony names the function itself; the declared tools are not needed to read a call
        self._calls = calls
        self._new_call_id = new_call_id or fresh_call_id
        self._state: Literal["header", "body", "between"] = "header"
        self._buffer = ""
        self._route: _Route = "content"
        self._name = ""
        self._tool_body: list[str] = []
        self._lead = True  # a body's leading newline is layout
        self._seed = ""  # the part of the first header the prompt wrote (its role)
        self._reasoned = self._fresh = False  # some reasoning was emitted; no text of this body yet
        self.tool_calls = 0
        if opening and START in opening:
            tail = opening[opening.rfind(START) + len(START):]
            if MESSAGE in tail:  # the template opened a body itself (a forced channel, or a prefill's)
                self._open_body(tail[: tail.find(MESSAGE)])
                self._lead = not tail[tail.find(MESSAGE) + len(MESSAGE):]  # after a prefill's text a newline is text
            else:
                self._seed = tail

    def finish(self, cut: bool = False) -> list[OutputEvent]:
        """Flush at the end of the reply: an open tool call (ended by <|call|>, which stops the row) is parsed, a
        header that never opened a body is content. `cut`: the token limit ended the reply, so a call's body that
        does not parse is a call with the arguments written so far, and a header the limit cut is markup (a call
        with none written when it names a recipient). Never raises."""
        events: list[OutputEvent] = []
        rest, self._buffer = self._buffer, ""
        if self._state == "body":
            self._emit_body(rest, events)
            self._close_body(events, cut)
        elif self._state == "header" and cut and (CHANNEL in rest or rest.strip() == "assistant"
                                                  or _RECIPIENT.search(self._seed + rest)):
            recipient = _RECIPIENT.search(self._seed + rest)
            if recipient and recipient.group(1) != "assistant" and self._calls:
                self._name = recipient.group(1).removeprefix("functions.")
                self._call("", events)
        elif self._state == "header" and rest.strip():
            self._emit(ContentText, _strip_markers(rest), events)
        self._state = "between"
        return events

    def _step(self, events: list[OutputEvent]) -> bool:
        buf = self._buffer
        if self._state == "between":
            starts = [i for i in (buf.find(START), buf.find(CHANNEL)) if i >= 0]
            if not starts:
                keep = held_suffix(buf, (START, CHANNEL))
                self._between_text(buf[: len(buf) - keep], events)
                self._buffer = buf[len(buf) - keep:]
                return False
            i = min(starts)
            self._between_text(buf[:i], events)
            self._buffer = buf[i + len(START):] if buf.startswith(START, i) else buf[i:]
            self._state = "header"
            return True
        if self._state == "header":
            i = buf.find(MESSAGE)
            if i >= 0:
                self._buffer = buf[i + len(MESSAGE):]
                self._open_body(self._seed + buf[:i])
                self._seed = ""
                return True
            if len(buf) > _MAX_HEADER or "\n" in buf or END in buf:
                # Not a header: the model wrote outside the format. Its text is content, as it wrote it.
                self._route, self._state, self._lead, self._seed = "content", "body", False, ""
                self._buffer = _strip_markers(buf)
                return True
            return False
        ends = [(buf.find(m), m) for m in _BODY_ENDS if m in buf]
        if not ends:
            keep = held_suffix(buf, MARKER_TEXTS)  # stray markers inside a body are held too, then left out
            self._emit_body(buf[: len(buf) - keep], events)
            self._buffer = buf[len(buf) - keep:]
            return False
        i, marker = min(ends)
        self._emit_body(buf[:i], events)
        self._close_body(events)
        if marker in (START, CHANNEL):  # a new message without <|end|>: its header starts here
            self._buffer = buf[i + len(START):] if marker == START else buf[i:]
            self._state = "header"
        else:
            self._buffer = buf[i + len(marker):]
            self._state = "between"
        return True

    def _open_body(self, header: str) -> None:
        recipient = _RECIPIENT.search(header)
        channel = _CHANNEL.search(header)
        if recipient and recipient.group(1) != "assistant":
            # tool_choice "none": what would be a call is content, as the other families' splitter makes it
            self._name = recipient.group(1).removeprefix("functions.")
            self._route = "tool" if self._calls else "content"
        elif channel and channel.group(1) in ("analysis", "commentary"):
            # A commentary preamble is reasoning too: handed back beside a call's `thinking`, gpt-oss's template
            # refuses an assistant turn with both content and thinking.
            self._route = "reasoning"
        else:  # final, or a header without a channel
            self._route = "content"
        self._state, self._lead, self._fresh, self._tool_body = "body", True, True, []

    def _emit_body(self, text: str, events: list[OutputEvent]) -> None:
        text = _strip_markers(text)
        if self._lead:
            text = text.lstrip("\n")
            if not text:
                return
            self._lead = False
        if self._route == "tool":
            self._tool_body.append(text)
        elif self._route == "reasoning":
            # Two messages of reasoning (analysis, then a preamble) read as two paragraphs.
            self._emit(ReasoningText, "\n\n" + text if self._reasoned and self._fresh else text, events)
            self._reasoned, self._fresh = True, False
        else:
            self._emit(ContentText, text, events)

    def _close_body(self, events: list[OutputEvent], cut: bool = False) -> None:
        if self._route != "tool":
            return
        body = "".join(self._tool_body).strip()
        self._tool_body = []
        try:
            if body:
                json.loads(body)
        except json.JSONDecodeError as exc:
            if cut:  # the arguments as written so far (OpenAI's shape of a call the limit cut)
                self._call(body, events)
                return
            log.info("a harmony tool call whose arguments do not parse is content (%s)", exc)
            self._emit(ContentText, body, events)
            return
        self._call(body or ("" if cut else "{}"), events)  # (none written before the cut: none said)

    def _call(self, arguments: str, events: list[OutputEvent]) -> None:
        index, self.tool_calls = self.tool_calls, self.tool_calls + 1
        events.append(ToolCallStart(index, self._new_call_id(), self._name))
        events.append(ToolCallArguments(index, arguments))

    def _between_text(self, text: str, events: list[OutputEvent]) -> None:
        # Between messages only layout is expected; anything else the model wrote is content, never dropped.
        text = _strip_markers(text)
        if text.strip():
            self._emit(ContentText, text, events)

    @staticmethod
    def _emit(kind: type[ContentText] | type[ReasoningText], text: str, events: list[OutputEvent]) -> None:
        if text:
            events.append(kind(text))


def _strip_markers(text: str) -> str:
    for marker in MARKER_TEXTS:
        text = text.replace(marker, "")
    return text
