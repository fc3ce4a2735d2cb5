"""Engine text → chat choice deltas, in one place for streamed and non-streamed replies.

A splitter (engine/chat_output.py's ChatOutputSplitter, or the plain one here) turns text deltas into
events: content, reasoning, tool-call start, tool-call argument fragments. ChatTranslator maps those
events to OpenAI `ChoiceDelta`s and accumulates the full assistant message for non-streamed replies.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, Sequence

from engine.chat_output import ContentText, OutputEvent, ReasoningText, ToolCallArguments, ToolCallStart
from service.chat.replies import (AssistantMessage, ChoiceDelta, FinishReason, FunctionCallDelta, MessageFunctionCall,
                                  MessageToolCall, ToolCallDelta)

__all__ = ["Splitter", "PlainSplitter", "ChatTranslator"]

_log = logging.getLogger(__name__)


class Splitter(Protocol):
    def feed(self, text: str) -> list[OutputEvent]: ...

    def finish(self, cut: bool = False) -> list[OutputEvent]: ...


class PlainSplitter:
    """Everything is content (models without think or tool-call markers)."""

    def feed(self, text: str) -> list[OutputEvent]:
        """Raises nothing."""
        return [ContentText(text)] if text else []

    def finish(self, cut: bool = False) -> list[OutputEvent]:
        """Raises nothing."""
        return []


class ChatTranslator:
    """One reply's translator: feed() engine text, finish() once; `message()` gives the whole reply."""

    def __init__(self, splitter: Splitter | None = None, *, one_call: bool = False,
                 max_calls: int | None = None, legacy: bool = False) -> None:
        """`max_calls`: the reply ends once that many calls have ended (`one_call`: one; None: no limit); `legacy`:
        its call comes in OpenAI's legacy shape (`function_call`, a request with `functions`), and it is the only
        one, as legacy replies had no parallel calls."""
        self._splitter: Splitter = splitter or PlainSplitter()
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, tuple[str, str, list[str]]] = {}
        self._legacy = legacy
        self._max_calls = 1 if one_call or legacy else max_calls
        self._ended_calls = 0
        # True once the reply has said all it may (parallel_tool_calls false: its first call ended): stop the row.
        self.done = False

    @classmethod
    def for_request(cls, tokenizer: Any, prompt_tokens: Sequence[int], tools: Any = None, *,
                    calls: bool = True, one_call: bool = False, json_calls: bool = False,
                    opening: str | None = None, forced_name: str | None = None,
                    max_calls: int | None = None, legacy: bool = False) -> "ChatTranslator":
        """The translator for a reply of `tokenizer`'s model family. `calls` false (tool_choice "none"): tool-call
        markers are content; `one_call` (parallel_tool_calls false): the reply ends after its first call,
        `max_calls` (the Responses API's max_tool_calls) after that many; `json_calls`: the tools were described in
        the prompt (service/chat/tool_text.py with_tool_prompt), so calls are <tool_call> JSON, parsed with mlx-lm's
        json_tools; `opening`: the template's generation prompt that ends the prompt (None: unknown, the prompt's
        last tokens decide); `forced_name`: the name every call must have (a forced call of one function: a call the
        token limit cut before its name still has it); `legacy`: the call in OpenAI's legacy shape. A harmony model
        (gpt-oss) gets its own splitter (engine/harmony.py), as does one whose template asks for Llama 3's bare JSON
        calls (engine/bare_json_calls.py). Raises nothing."""
        limit = 1 if one_call else max_calls
        try:
            from engine.chat_output import ChatOutputSplitter, OutputMarkers, opens_reasoning, starts_in_reasoning
            from engine.bare_json_calls import BareJsonCallSplitter, declared_names, writes_bare_json_calls
            from engine.harmony import HarmonySplitter, is_harmony
            from service.chat.prompt import template_source

            if is_harmony(tokenizer) and not json_calls:
                return cls(HarmonySplitter(tools=tools, calls=calls, opening=opening), max_calls=limit, legacy=legacy)
            markers = OutputMarkers.from_tokenizer(tokenizer)
            if (tools and calls and not json_calls and markers.tool_call_start is None and not markers.has_thinking
                    and writes_bare_json_calls(template_source(tokenizer))):
                return cls(BareJsonCallSplitter(declared_names(tools)), max_calls=limit, legacy=legacy)
            if json_calls:
                markers = markers.with_json_tool_calls()
            if not calls:
                markers = markers.without_tool_calls()
            if markers.has_thinking or markers.tool_call_start:
                reasoning = (opens_reasoning(tokenizer, opening) if opening is not None
                             else starts_in_reasoning(tokenizer, prompt_tokens))
                splitter = ChatOutputSplitter(markers, tools=tools, in_reasoning=reasoning, forced_name=forced_name)
                return cls(splitter, max_calls=limit, legacy=legacy)
        except Exception:  # noqa: BLE001 — a tokenizer without the attributes: plain content, said in the log
            _log.warning("reply read as plain content: the model's output markers could not be set up", exc_info=True)
        return cls(max_calls=limit, legacy=legacy)

    @property
    def has_tool_calls(self) -> bool:
        return bool(self._calls)

    def feed(self, text: str) -> list[ChoiceDelta]:
        """Deltas for one chunk of engine text. Raises nothing."""
        return self._translate(self._splitter.feed(text)) if text else []

    def finish(self, cut: bool = False) -> list[ChoiceDelta]:
        """Deltas for text held back until the end of the reply. `cut`: the token limit ended it (finish_reason
        "length"), so a call it cut comes as a call with the arguments written so far, never as markup. Raises
        nothing."""
        return self._translate(self._splitter.finish(cut))

    def finish_reason(self, engine_reason: str | None) -> FinishReason:
        """OpenAI finish_reason for the engine's: tool_calls (function_call, legacy) when the reply called a tool.
        Raises nothing."""
        if self._calls and engine_reason in (None, "stop"):
            return "function_call" if self._legacy else "tool_calls"
        return "length" if engine_reason == "length" else "stop"

    def message(self) -> AssistantMessage:
        """The accumulated assistant message (non-streamed replies). Raises nothing."""
        calls = [
            MessageToolCall(id=call_id, function=MessageFunctionCall(name=name, arguments="".join(args)))
            for _, (call_id, name, args) in sorted(self._calls.items())
        ]
        return AssistantMessage(
            content="".join(self._content) if (self._content or not calls) else None,
            reasoning_content="".join(self._reasoning) or None,
            tool_calls=None if self._legacy else calls or None,
            function_call=calls[0].function if calls and self._legacy else None,
        )

    def _translate(self, events: list[OutputEvent]) -> list[ChoiceDelta]:
        deltas: list[ChoiceDelta] = []
        for event in events:
            if self.done:
                break
            if isinstance(event, ContentText):
                if event.text:
                    self._content.append(event.text)
                    deltas.append(ChoiceDelta(content=event.text))
            elif isinstance(event, ReasoningText):
                if event.text:
                    self._reasoning.append(event.text)
                    deltas.append(ChoiceDelta(reasoning_content=event.text))
            elif isinstance(event, ToolCallStart):
                self._calls[event.index] = (event.id, event.name, [])
                deltas.append(self._call_delta(event.index, FunctionCallDelta(name=event.name, arguments=""),
                                               event.id))
            elif isinstance(event, ToolCallArguments):
                if event.index in self._calls:
                    self._calls[event.index][2].append(event.arguments)
                if event.arguments:  # (a streamed call's last fragment may be empty: its arguments were all sent)
                    deltas.append(self._call_delta(event.index, FunctionCallDelta(arguments=event.arguments)))
                # parallel_tool_calls false or max_tool_calls: the reply ends with the call that reaches the limit
                # (the row stops before another)
                if event.last:
                    self._ended_calls += 1
                    self.done = self._max_calls is not None and self._ended_calls >= self._max_calls
        return deltas

    def _call_delta(self, index: int, function: FunctionCallDelta, call_id: str | None = None) -> ChoiceDelta:
        """A call's delta: a tool_calls entry (its first with the id), or the legacy `function_call`, which has no
        index or id (one call a reply). Raises nothing."""
        if self._legacy:
            return ChoiceDelta(function_call=function)
        first = call_id is not None
        return ChoiceDelta(tool_calls=[ToolCallDelta(index=index, id=call_id, type="function" if first else None,
                                                     function=function)])
