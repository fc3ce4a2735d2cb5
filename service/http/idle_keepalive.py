"""Keep-alives in a stream that has gone quiet after its first event.

A reply can be silent long after its headers: a tool call of a family that comes whole (Qwen3-Coder's XML, Mistral,
harmony) is nothing until its block closes, a row waits out a long prefill beside it. A proxy's idle timer (60 s is
common) or a client's read timeout then cuts it. So the stream's events are read by a task in the app's task group
(a cancel scope must not span a generator's yield) and handed over through a memory stream, and a second task wakes
when nothing went out for the interval and puts a keep-alive in the queue. No timeout scope per event: the ticker sleeps
until the interval since the last event ends.
"""

from __future__ import annotations

from typing import AsyncGenerator, Callable

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

__all__ = ["kept_alive_while_idle"]



class _Clock:
    """When the stream last handed something on (anyio's clock)."""

    def __init__(self) -> None:
        self.last = anyio.current_time()


async def kept_alive_while_idle(events: AsyncGenerator[bytes, None], keepalive: Callable[[], bytes], every: float,
                                task_group: TaskGroup) -> AsyncGenerator[bytes, None]:
    """`events` as they come, with `keepalive()` whenever none came for `every` seconds. Raises what `events`
    raises; closing this generator cancels the reader task where it waits and closes `events`."""
    send, receive = anyio.create_memory_object_stream[bytes | Exception](64)
    clock = _Clock()
    ticking, pumping = anyio.CancelScope(), anyio.CancelScope()
    task_group.start_soon(_pump, events, send, pumping)
    task_group.start_soon(_tick, send, keepalive, clock, every, ticking)
    try:
        async with receive:
            async for item in receive:
                if isinstance(item, Exception):
                    raise item
                clock.last = anyio.current_time()
                yield item
    finally:
        ticking.cancel()
        pumping.cancel()  # a client that left stops the source at once, as it would read directly (a Whisper step)


async def _pump(events: AsyncGenerator[bytes, None], send: MemoryObjectSendStream[bytes | Exception],
                scope: anyio.CancelScope) -> None:
    """`events` into `send`, then its end (or its failure), until `scope` is cancelled. Raises nothing: it runs in
    the app's task group."""
    with scope, send:
        try:
            try:
                async for event in events:
                    try:  # at once when there is room: nothing comes between an event and its place in the queue
                        send.send_nowait(event)
                    except anyio.WouldBlock:
                        await send.send(event)
            finally:
                await events.aclose()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # the stream was closed: the client left
        except Exception as exc:  # noqa: BLE001 — raised where the stream is read, never into the app
            try:
                await send.send(exc)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass


async def _tick(send: MemoryObjectSendStream[bytes | Exception], keepalive: Callable[[], bytes], clock: _Clock,
                every: float, scope: anyio.CancelScope) -> None:
    """A keep-alive into `send` each time `every` seconds pass with nothing sent, until the stream ends. Written
    when queued, so one that numbers its events (the Responses API's in_progress) numbers it in its place. Raises
    nothing."""
    with scope:
        while True:
            await anyio.sleep(max(0.0, clock.last + every - anyio.current_time()))
            if anyio.current_time() < clock.last + every:
                continue
            clock.last = anyio.current_time()  # the next one an interval later
            stats = send.statistics()
            if stats.current_buffer_used >= stats.max_buffer_size:
                continue  # events are waiting to go out: the stream is not idle
            try:
                send.send_nowait(keepalive())
            except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                return
