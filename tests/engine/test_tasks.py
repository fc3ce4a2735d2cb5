"""ExecutionTasks: FIFO order, one task per advance, cancellation before vs after start, errors."""

from __future__ import annotations

from typing import Any, Callable

import anyio
import pytest

from engine.tasks import ExecutionTasks, TaskRejected

pytestmark = pytest.mark.anyio


class InlineContext:
    """Runs work inline on the event loop (the ExecutionContext contract without a thread)."""

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


class GatedContext:
    """Runs work only after `release` is set, announcing `started` first (to cancel mid-task)."""

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.release = anyio.Event()

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.started.set()
        with anyio.CancelScope(shield=True):
            await self.release.wait()
        return fn(*args)


async def test_tasks_run_in_fifo_order() -> None:
    tasks, ran = ExecutionTasks(), []
    handles = [tasks.enqueue(lambda i=i: ran.append(i) or i, label=f"t{i}") for i in range(3)]
    assert tasks.labels() == ["t0", "t1", "t2"]
    while await tasks.advance(InlineContext()):
        pass
    assert ran == [0, 1, 2]
    assert [await h for h in handles] == [0, 1, 2]
    assert tasks.completed == 3


async def test_advance_runs_exactly_one_task() -> None:
    tasks, ran = ExecutionTasks(), []
    for i in range(3):
        tasks.enqueue(lambda i=i: ran.append(i))
    assert await tasks.advance(InlineContext()) is True
    assert ran == [0]
    assert len(tasks) == 2


async def test_advance_on_empty_queue_returns_false() -> None:
    assert await ExecutionTasks().advance(InlineContext()) is False


async def test_cancelled_queued_task_never_runs() -> None:
    tasks, ran = ExecutionTasks(), []
    scope = anyio.CancelScope()
    handle = tasks.enqueue(lambda: ran.append("doomed"), cancellation=scope)
    tasks.enqueue(lambda: ran.append("kept"))
    scope.cancel()
    assert tasks.prune() == 1
    await tasks.advance(InlineContext())
    assert ran == ["kept"]
    with pytest.raises(TaskRejected):
        await handle


async def test_run_cancelled_while_queued_is_removed_and_never_runs() -> None:
    tasks, ran = ExecutionTasks(), []
    async with anyio.create_task_group() as tg:

        async def waiter() -> None:
            await tasks.run(lambda: ran.append("late"), label="late")

        tg.start_soon(waiter)
        await tasks.wait_changed()  # the waiter has enqueued
        assert tasks.labels() == ["late"]
        tg.cancel_scope.cancel()
    assert len(tasks) == 0
    await tasks.advance(InlineContext())
    assert ran == []


async def test_started_task_completes_even_if_awaiter_is_cancelled() -> None:
    tasks, ctx, ran = ExecutionTasks(), GatedContext(), []
    observed: list[str] = []
    async with anyio.create_task_group() as tg:

        async def waiter() -> None:
            try:
                await tasks.run(lambda: ran.append("done"), label="window")
            except anyio.get_cancelled_exc_class():
                observed.append(f"cancelled after run: {ran}")
                raise

        tg.start_soon(waiter)
        await tasks.wait_changed()
        tg.start_soon(tasks.advance, ctx)
        await ctx.started.wait()
        tg.cancel_scope.cancel()  # the awaiter goes; the started task must still finish first
        ctx.release.set()
    assert ran == ["done"]
    assert observed == ["cancelled after run: ['done']"]
    assert tasks.completed == 1


async def test_task_error_goes_to_its_awaiter_and_the_queue_goes_on() -> None:
    tasks, ran = ExecutionTasks(), []

    def boom() -> None:
        raise ValueError("bad window")

    bad = tasks.enqueue(boom)
    tasks.enqueue(lambda: ran.append("next"))
    await tasks.advance(InlineContext())
    await tasks.advance(InlineContext())
    with pytest.raises(ValueError, match="bad window"):
        await bad
    assert ran == ["next"]


async def test_reject_all_fails_queued_tasks() -> None:
    tasks = ExecutionTasks()
    handles = [tasks.enqueue(lambda: None) for _ in range(2)]
    tasks.reject_all("bye")
    for h in handles:
        with pytest.raises(TaskRejected, match="bye"):
            await h
    assert len(tasks) == 0


async def test_work_queued_after_reject_all_fails_at_once() -> None:
    tasks = ExecutionTasks()
    tasks.reject_all("closed")
    handle = tasks.enqueue(lambda: 1, label="late")
    with pytest.raises(TaskRejected, match="closed"):
        await handle
    with pytest.raises(TaskRejected):
        await tasks.run(lambda: 2)
    assert tasks.labels() == [] and not tasks.pending


async def test_ran_within_tells_other_labels_apart_and_ages() -> None:
    tasks = ExecutionTasks()
    assert not tasks.ran_within(60.0, besides="own")
    tasks.enqueue(lambda: None, label="own")
    assert await tasks.advance(InlineContext())
    assert not tasks.ran_within(60.0, besides="own")  # the group's own label does not count
    tasks.enqueue(lambda: None, label="whisper.step")
    assert await tasks.advance(InlineContext())
    assert tasks.ran_within(60.0, besides="own")
    assert not tasks.ran_within(0.0, besides="own")  # older than the window
