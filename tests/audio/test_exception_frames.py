"""audio/exception_frames.py: the frames an exception passed let go of their locals, its traceback still says where;
a task group's child started released keeps nothing of its call once cancelled."""

from __future__ import annotations

import functools
import gc
import traceback
import weakref

import anyio
import pytest

from audio.exception_frames import FramesReleased, release_frames, start_released


class Held:
    """Something big a frame holds (a model)."""


def _fails(held: Held) -> None:
    raise ValueError("inner")


def _fails_while_handling(held: Held) -> None:
    try:
        _fails(held)
    except ValueError:
        raise RuntimeError("outer") from None  # the context is kept all the same (__suppress_context__)


def test_the_frames_an_exception_passed_let_go_of_their_locals() -> None:
    held = Held()
    gone = weakref.ref(held)
    try:
        _fails_while_handling(held)
    except RuntimeError as exc:
        caught = exc
    del held
    assert gone() is not None  # the frames of the error and of the one it was raised during hold it
    release_frames(caught)
    assert gone() is None
    where = "".join(traceback.format_exception(caught.__context__))  # type: ignore[arg-type]
    assert "_fails" in where and "inner" in where


def test_a_block_left_by_an_exception_releases_its_frames() -> None:
    held = Held()
    gone = weakref.ref(held)
    with pytest.raises(ValueError) as err:
        with FramesReleased():
            _fails(held)
    del held
    assert gone() is None and err.value.__traceback__ is not None


@pytest.mark.anyio
async def test_a_cancelled_child_started_released_keeps_nothing_of_its_call() -> None:
    held = Held()
    gone = weakref.ref(held)
    started = anyio.Event()

    async def work(model: Held) -> None:  # as a chunk's decode over the model
        started.set()
        await anyio.sleep_forever()

    gc.collect()
    gc.disable()  # what only a collection frees stays
    try:
        async with anyio.create_task_group() as tg:
            start_released(tg, functools.partial(work, held))  # tg.start_soon(work, held) kept it
            await started.wait()
            tg.cancel_scope.cancel()
        del held
        assert gone() is None
    finally:
        gc.enable()
