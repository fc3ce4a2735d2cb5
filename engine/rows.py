"""A row of the LLM batch group, and the delta stream its consumer iterates (closing it cancels the row)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from engine.contracts import Delta, GenerationRequest
from engine.sampling import RowSampler, StopMatcher

__all__ = ["Row", "LLMRowStream", "plan_iteration"]


@dataclass(eq=False)
class Row:
    """One generation inside the group. `done` counts prompt tokens whose KV is in `cache`."""

    request: GenerationRequest
    send: MemoryObjectSendStream[Delta]
    sampler: RowSampler
    stopper: StopMatcher
    prompt: list[int]
    cache: list[Any] | None = None  # per-row KV while preparing; None once the KV moved to `slot`
    slot: int | None = None  # the runner's SlotKV slot holding this decoding row's KV
    done: int = 0
    cached_tokens: int = 0
    last_token: int | None = None  # sampled but not yet fed: the next decode input
    generated: list[int] = field(default_factory=list)
    cancelled: bool = False
    finished: bool = False
    unsent_ids: list[int] = field(default_factory=list)
    boundaries: list[int] = field(default_factory=list)

    @property
    def preparing(self) -> bool:
        return not self.finished and self.done < len(self.prompt)

    @property
    def decoding(self) -> bool:
        return not self.finished and self.last_token is not None

    def fed_tokens(self) -> list[int]:
        """The tokens whose KV the cache holds (the last sampled token is never fed)."""
        return self.prompt[: self.done] + self.generated[:-1]


def plan_iteration(rows: list[Row], budget: int, decode: bool,
                   prefill: bool) -> list[tuple[Row, list[int], bool]]:
    """(row, tokens, wants logits) per segment: every decoding row's token first, then prompt chunks (oldest
    row first) filling the rest of `budget`. Raises nothing."""
    plan: list[tuple[Row, list[int], bool]] = []
    if decode:
        plan += [(r, [r.last_token], True) for r in rows if r.decoding]  # type: ignore[list-item]
    if prefill:
        left = budget - len(plan)
        for r in rows:
            if left <= 0:
                break
            if r.preparing:
                n = min(left, len(r.prompt) - r.done)
                plan.append((r, r.prompt[r.done : r.done + n], r.done + n == len(r.prompt)))
                left -= n
    return plan


class LLMRowStream:
    """Async iterator over one row's deltas. `aclose()` (or leaving `async with`) cancels the row."""

    def __init__(self, row: Row, receive: MemoryObjectReceiveStream[Delta], wake: Callable[[], None]) -> None:
        self._row = row
        self._receive = receive
        self._wake = wake  # tells the group a row changed, so an idle driver looks again

    def __aiter__(self) -> "LLMRowStream":
        return self

    async def __anext__(self) -> Delta:
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._receive.close()
            raise StopAsyncIteration from None

    def receive_nowait(self) -> Delta:
        """The next delta if one is ready. Raises anyio.WouldBlock when none is, anyio.EndOfStream at the end."""
        return self._receive.receive_nowait()

    async def aclose(self) -> None:
        """Cancel the row (if still running) and release the stream. Raises nothing."""
        self.cancel()

    def cancel(self) -> None:
        """Synchronous cancel, safe from any event-loop code path (e.g. a finally). Raises nothing."""
        if not self._row.finished:
            self._row.cancelled = True
        self._receive.close()
        self._wake()

    async def __aenter__(self) -> "LLMRowStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()

    def __del__(self) -> None:  # a consumer that forgets aclose still frees its row
        if not self._row.finished:
            self._row.cancelled = True
        self._receive.close()
