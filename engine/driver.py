"""drive_execution_group — the one cooperative loop that advances all model work."""

from __future__ import annotations

import anyio

from engine.contracts import ExecutionContext, ExecutionGroup

__all__ = ["drive_execution_group", "iteration_budget"]


def iteration_budget(group: ExecutionGroup) -> int:
    """Running rows' tokens are reserved first; prompt chunks get what the group allows on top (at least
    its minimum; engine/pacing.py for the LLM group)."""
    return group.running_tokens() + group.prefill_tokens()


async def drive_execution_group(group: ExecutionGroup, lease: anyio.Lock, context: ExecutionContext) -> None:
    """Advance `group` until it closes: one task, admission, one model step, then yield, per iteration."""
    while not group.closed:
        group.prune()
        if not group.has_work():
            await group.wait_for_work()
            continue
        async with lease:
            if group.tasks.pending:
                await group.tasks.advance(context)
            group.admit()
            if group.has_decoding() and group.has_preparing() and group.supports_mixed():
                await group.advance_mixed(iteration_budget(group))
            elif group.has_preparing():
                await group.advance_preparation()
            elif group.has_decoding():
                await group.advance()
        # Let SSE writers and HTTP handlers run between iterations.
        await anyio.sleep(0)
