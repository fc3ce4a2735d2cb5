"""drive_execution_group with a scripted fake group: ordering, one task per iteration, the budget rule."""

from __future__ import annotations

from typing import Any, Callable

import anyio
import pytest

from engine.driver import drive_execution_group, iteration_budget
from engine.tasks import ExecutionTasks

pytestmark = pytest.mark.anyio


class InlineContext:
    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


class FakeGroup:
    """Rows are counters: `decode` rows each need `steps` decode iterations; `prepare` rows one prefill."""

    def __init__(self, *, decode_steps: int = 0, rows: int = 1, prepare: int = 0, mixed: bool = True,
                 max_iteration_tokens: int = 512, minimum_preparation_tokens: int = 32) -> None:
        self.tasks = ExecutionTasks()
        self.log: list[str] = []
        self.rows = rows
        self.decode_steps = decode_steps
        self.prepare = prepare
        self.mixed = mixed
        self.max_iteration_tokens = max_iteration_tokens
        self.minimum_preparation_tokens = minimum_preparation_tokens
        self._closed = False
        self.idle = anyio.Event()
        self.work_arrived = anyio.Event()

    @property
    def closed(self) -> bool:
        return self._closed

    def prune(self) -> None:
        self.log.append("prune")
        self.tasks.prune()

    def has_work(self) -> bool:
        return self.has_decoding() or self.has_preparing() or self.tasks.pending

    async def wait_for_work(self) -> None:
        self.log.append("wait")
        self.idle.set()
        await self.work_arrived.wait()

    def admit(self) -> None:
        self.log.append("admit")

    def has_decoding(self) -> bool:
        return self.decode_steps > 0

    def has_preparing(self) -> bool:
        return self.prepare > 0

    def supports_mixed(self) -> bool:
        return self.mixed

    def running_tokens(self) -> int:
        return self.rows if self.has_decoding() else 0

    def prefill_tokens(self) -> int:
        return max(self.max_iteration_tokens - self.running_tokens(), self.minimum_preparation_tokens)

    async def advance_mixed(self, budget: int) -> None:
        self.log.append(f"mixed:{budget}")
        self.prepare -= 1
        self._decoded()

    async def advance_preparation(self) -> None:
        self.log.append("prepare")
        self.prepare -= 1

    async def advance(self) -> None:
        self.log.append("decode")
        self._decoded()

    def _decoded(self) -> None:
        self.decode_steps -= 1
        if self.decode_steps == 0 and not self.tasks.pending and not self.prepare:
            self._closed = True

    def close(self) -> None:
        self._closed = True


def steps(log: list[str]) -> list[str]:
    return [e for e in log if e not in ("prune", "admit")]


async def test_one_task_per_iteration_between_decode_steps() -> None:
    group = FakeGroup(decode_steps=3)
    for i in range(3):
        group.tasks.enqueue(lambda i=i: group.log.append(f"task{i}"))
    await drive_execution_group(group, anyio.Lock(), InlineContext())
    assert steps(group.log) == ["task0", "decode", "task1", "decode", "task2", "decode"]


async def test_every_iteration_prunes_then_admits_before_the_model_step() -> None:
    group = FakeGroup(decode_steps=2)
    await drive_execution_group(group, anyio.Lock(), InlineContext())
    assert group.log == ["prune", "admit", "decode", "prune", "admit", "decode"]


async def test_mixed_iteration_when_rows_decode_and_prepare() -> None:
    group = FakeGroup(decode_steps=2, rows=3, prepare=1)
    await drive_execution_group(group, anyio.Lock(), InlineContext())
    assert steps(group.log) == ["mixed:512", "decode"]


async def test_without_a_packed_path_preparation_and_decode_alternate() -> None:
    group = FakeGroup(decode_steps=1, prepare=1, mixed=False)
    await drive_execution_group(group, anyio.Lock(), InlineContext())
    assert steps(group.log) == ["prepare", "decode"]


def test_budget_reserves_running_rows_first() -> None:
    group = FakeGroup(decode_steps=1, rows=8, max_iteration_tokens=512, minimum_preparation_tokens=32)
    assert iteration_budget(group) == 512


def test_budget_below_one_token_per_row_still_prepares() -> None:
    # 2 tokens of budget, 5 decoding rows: all 5 decode AND prompts still get the minimum on top.
    group = FakeGroup(decode_steps=1, rows=5, max_iteration_tokens=2, minimum_preparation_tokens=32)
    assert iteration_budget(group) == 5 + 32


async def test_idle_driver_waits_for_work_and_holds_no_lease() -> None:
    group = FakeGroup()
    lease = anyio.Lock()
    async with anyio.create_task_group() as tg:
        tg.start_soon(drive_execution_group, group, lease, InlineContext())
        await group.idle.wait()
        assert steps(group.log) == ["wait"]
        assert not lease.locked()
        group.decode_steps = 1
        group.work_arrived.set()
    assert steps(group.log) == ["wait", "decode"]


async def test_lease_is_held_during_a_step() -> None:
    group = FakeGroup(decode_steps=1)
    lease = anyio.Lock()
    seen: list[bool] = []

    async def advance() -> None:
        seen.append(lease.locked())
        group._closed = True

    group.advance = advance  # type: ignore[method-assign]
    await drive_execution_group(group, lease, InlineContext())
    assert seen == [True]
    assert not lease.locked()
