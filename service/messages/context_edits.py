"""Anthropic's context editing (`context_management.edits`) applied to a Messages request before it renders: the
client keeps its whole history and the server chooses what the model reads, as Anthropic's API does.

`clear_thinking_20251015` leaves out the thinking blocks of every assistant turn but the last `keep` that have
some; `clear_tool_uses_20250919`, once the prompt passes `trigger`, replaces the results of every tool use but the
last `keep` (bar `exclude_tools`) with a placeholder, and their inputs where `clear_tool_inputs` says, unless that
clears fewer prompt tokens than `clear_at_least`. The edits apply in the order given; each one that changed the
conversation is reported (`applied_edits`) with the prompt tokens it cleared, counted by rendering the prompt
before and after it (a template that drops earlier thinking anyway cleared none). An edit that changes nothing
costs no rendering.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, TypeVar

from service.messages.schemas import (AllThinkingTurns, ClearThinkingEdit, ClearToolUsesEdit, CountTokensRequest,
                                      MessageTurn, RedactedThinkingBlock, ThinkingBlock, ToolResultBlock,
                                      ToolUseBlock)

__all__ = ["apply_edits", "PromptCounter", "CLEARED_RESULT"]

CLEARED_RESULT = "[This tool result was cleared from the context to save space.]"

Body = TypeVar("Body", bound=CountTokensRequest)


class PromptCounter:
    """A body's prompt length in tokens by `count` (rendering it), each body counted once."""

    def __init__(self, count: Callable[[CountTokensRequest], Awaitable[int]]) -> None:
        self._count = count
        self._counted: dict[int, tuple[CountTokensRequest, int]] = {}  # by id; the body kept so the id stays its

    async def __call__(self, body: CountTokensRequest) -> int:
        """Raises what `count` raises (APIError 400 for a prompt that cannot render)."""
        if id(body) not in self._counted:
            self._counted[id(body)] = (body, await self._count(body))
        return self._counted[id(body)][1]


async def apply_edits(body: Body, count: PromptCounter) -> tuple[Body, list[dict[str, Any]]]:
    """`body` with its context_management edits applied, and the applied edits as Anthropic reports them.

    Raises what `count` raises."""
    applied: list[dict[str, Any]] = []
    for edit in (body.context_management.edits if body.context_management is not None else None) or ():
        if isinstance(edit, ClearThinkingEdit):
            edited, turns = _clear_thinking(body, edit)
            if not turns:
                continue
            report: dict[str, Any] = {"type": edit.type, "cleared_thinking_turns": turns}
        else:
            edited, uses = _clear_tool_uses(body, edit)
            if not uses or not await _triggered(body, edit, count):
                continue
            report = {"type": edit.type, "cleared_tool_uses": uses}
        cleared = await count(body) - await count(edited)
        at_least = edit.clear_at_least.value if isinstance(edit, ClearToolUsesEdit) and edit.clear_at_least else 0
        if cleared < at_least:  # clearing breaks the cached prefix: not for less than the client deems worth it
            continue
        if cleared < 0:  # placeholders longer than the results they stand for (a probe: 1,000 "R"s, +12k tokens)
            continue
        applied.append({**report, "cleared_input_tokens": cleared})
        body = edited
    return body, applied


def _with_turns(body: Body, turns: list[MessageTurn]) -> Body:
    return body.model_copy(update={"messages": turns})


def _clear_thinking(body: Body, edit: ClearThinkingEdit) -> tuple[Body, int]:
    """`body` without the thinking of all assistant turns but the last `keep` having some; how many lost it."""
    if edit.keep == "all" or isinstance(edit.keep, AllThinkingTurns):
        return body, 0
    thinking = (ThinkingBlock, RedactedThinkingBlock)
    turns = [i for i, turn in enumerate(body.messages) if turn.role == "assistant" and isinstance(turn.content, list)
             and any(isinstance(block, thinking) for block in turn.content)]
    cleared = set(turns[:max(len(turns) - edit.keep.value, 0)])
    if not cleared:
        return body, 0
    kept = [turn.model_copy(update={"content": [b for b in turn.content if not isinstance(b, thinking)]})
            if i in cleared else turn for i, turn in enumerate(body.messages)]
    return _with_turns(body, kept), len(cleared)


def _uses(body: CountTokensRequest) -> list[ToolUseBlock]:
    return [block for turn in body.messages if turn.role == "assistant" and isinstance(turn.content, list)
            for block in turn.content if isinstance(block, ToolUseBlock)]


async def _triggered(body: CountTokensRequest, edit: ClearToolUsesEdit, count: PromptCounter) -> bool:
    if edit.trigger.type == "tool_uses":
        return len(_uses(body)) > edit.trigger.value
    return await count(body) > edit.trigger.value


def _clear_tool_uses(body: Body, edit: ClearToolUsesEdit) -> tuple[Body, int]:
    """`body` with the results (and inputs, as asked) of all tool uses but the last `keep` cleared, those of
    `exclude_tools` kept; how many uses were cleared. The trigger is not checked here."""
    uses = _uses(body)
    excluded = set(edit.exclude_tools or ())
    cleared = [use for use in uses[:max(len(uses) - edit.keep.value, 0)] if use.name not in excluded]
    results = {use.id for use in cleared}
    inputs = {use.id for use in cleared if edit.clear_tool_inputs is True
              or isinstance(edit.clear_tool_inputs, list) and use.name in edit.clear_tool_inputs}
    if not results:
        return body, 0

    changed: set[str] = set()  # the uses whose result or input this edit clears (not already cleared ones)

    def block(b: Any) -> Any:
        if isinstance(b, ToolResultBlock) and b.tool_use_id in results and b.content != CLEARED_RESULT:
            changed.add(b.tool_use_id)
            return b.model_copy(update={"content": CLEARED_RESULT})
        if isinstance(b, ToolUseBlock) and b.id in inputs and b.input:
            changed.add(b.id)
            return b.model_copy(update={"input": {}})
        return b

    turns = [turn.model_copy(update={"content": [block(b) for b in turn.content]}) if isinstance(turn.content, list)
             else turn for turn in body.messages]
    return (_with_turns(body, turns), len(changed)) if changed else (body, 0)
