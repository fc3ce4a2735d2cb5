"""What an exception keeps alive: the frames it passed through, and with them their locals (Whisper's model, a window's
log-mel and encoder arrays).

anyio's task group (4.16, on asyncio) keeps the exception of a child task that ended cancelled in a reference cycle
(its `task_done` holds it in a local that the exception's traceback reaches), so only a full collection frees the frames
it passed, and a serving process rarely runs one: a Realtime socket that ended mid-utterance left tiny.en in memory
after its unload (147.7 MiB of MLX memory, 90 s on; large-v3's would be 3 GB, and two copies at the next load). Where
Whisper's work runs under a task that may be cancelled, the frames below it let go of their locals as the exception
leaves them (their traceback still prints, with its files and lines). A frame keeps its function all the same, so the
task's own frame, and any closure in the chain, must reach no model (`start_released`).
"""

from __future__ import annotations

import traceback
from types import TracebackType
from typing import Awaitable, Callable

import anyio.abc

__all__ = ["FramesReleased", "release_frames", "start_released"]


def release_frames(exc: BaseException) -> None:
    """Drop the locals of the ended frames that `exc`, and the exceptions it was raised from or during, passed
    through (a frame still running keeps its own). Raises nothing."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        todo += [e.__cause__, e.__context__]


class FramesReleased:
    """`with FramesReleased():` whatever leaves the block (a cancellation, an error) takes the frames it passed
    through without their locals. Raises nothing of its own."""

    def __enter__(self) -> "FramesReleased":
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None:
            release_frames(exc)


def start_released(tg: anyio.abc.TaskGroup, call: Callable[[], Awaitable[None]], name: str | None = None) -> None:
    """`tg.start_soon(call)` with the frames below released, and the task's own frame holding nothing of `call` (a
    partial over the model): the frame anyio's cycle keeps. Raises nothing of its own."""
    held = [call]

    async def child() -> None:
        with FramesReleased():
            await held.pop()()

    tg.start_soon(child, name=name)
