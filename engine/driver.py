"""drive_execution_group — the one cooperative loop that advances all model work."""

from __future__ import annotations

from typing import Protocol

import anyio

from engine.blas_threads import follow_chat, recheck
from engine.contracts import ExecutionContext
from engine.gemv_shim import GEMV_ROWS
from engine.tasks import ExecutionTasks

__all__ = ["ExecutionGroup", "drive_execution_group", "iteration_budget"]


class ExecutionGroup(Protocol):
    """A unit the driver advances: rows of model work plus queued tasks sharing the lease."""

    tasks: ExecutionTasks

    @property
    def closed(self) -> bool: ...

    def prune(self) -> None:
        """Drop cancelled rows (freeing their KV) and cancelled queued tasks."""

    def has_work(self) -> bool:
        """Anything active, preparing (prefill left), queued for admission, or a pending task."""
        ...

    async def wait_for_work(self) -> None:
        """Return when has_work() may have become true, or the group closed."""

    def admit(self) -> None:
        """Move queued requests into the active set while the budget allows."""

    def has_decoding(self) -> bool: ...

    def has_preparing(self) -> bool: ...

    def supports_mixed(self) -> bool: ...

    @property
    def max_iteration_tokens(self) -> int: ...

    @property
    def minimum_preparation_tokens(self) -> int: ...

    def running_tokens(self) -> int:
        """Tokens the decoding rows need this iteration (one per row)."""
        ...

    def prefill_tokens(self) -> int:
        """Prompt tokens a mixed iteration may carry on top of the decoding rows' (>= the minimum), or 0: this one
        decodes only (the LLM group's pacer measures a decode step first: engine/pacing.py)."""
        ...

    async def advance_mixed(self, budget: int) -> None:
        """One packed iteration: every decode row plus prefill chunks filling the rest of budget."""

    async def advance_preparation(self) -> None:
        """One prefill chunk for the preparing rows (within max_iteration_tokens)."""

    async def advance(self) -> None:
        """One decode step for every decoding row."""



def iteration_budget(group: ExecutionGroup) -> int:
    """Running rows' tokens are reserved first; prompt chunks get what the group allows on top (at least
    its minimum, or none for an iteration that measures a decode step; engine/pacing.py for the LLM group)."""
    return group.running_tokens() + group.prefill_tokens()


async def drive_execution_group(group: ExecutionGroup, lease: anyio.Lock, context: ExecutionContext) -> None:
    """Advance `group` until it closes: one task, admission, one model step, then yield, per iteration."""
    chat: tuple[bool, bool] | None = None  # whether chat ran at the last iteration, and wide: OpenBLAS's threads follow
    while not group.closed:
        group.prune()
        if not group.has_work():
            if chat != (False, False):
                chat = (False, False)
                follow_chat(False)  # nothing runs but what may come: speech alone may take every core
            await group.wait_for_work()
            continue
        async with lease:
            if group.tasks.pending:
                await group.tasks.advance(context)
            group.admit()
            decoding, preparing = group.has_decoding(), group.has_preparing()
            # GEMV_ROWS: narrower products are GEMVs (engine/gemv_shim.py), which a second BLAS thread does not speed up.
            now = (decoding or preparing, preparing or group.running_tokens() > GEMV_ROWS)
            if chat != now:
                chat = now
                follow_chat(*now)  # OpenBLAS's threads: a core for the event loop while chat shares the machine
            recheck()  # ...and whether it does: the rest of the machine's load, sampled once a second
            if decoding and preparing and group.supports_mixed():
                await group.advance_mixed(iteration_budget(group))
            elif preparing:
                await group.advance_preparation()
            elif decoding:
                await group.advance()
        # Let SSE writers and HTTP handlers run between iterations.
        await anyio.sleep(0)
