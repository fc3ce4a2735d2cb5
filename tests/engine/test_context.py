"""engine/context.py: an engine thread lowered in CPU priority runs its jobs, and the MLX stream worker its first
MLX op starts, at that priority; other threads keep theirs."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from engine.context import EngineThread

pytestmark = [pytest.mark.anyio, pytest.mark.skipif(not sys.platform.startswith("linux"),
                                                     reason="threads have their own priority on Linux")]


def _tasks() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def _nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


async def test_a_lowered_thread_and_the_mlx_worker_it_starts_run_lower() -> None:
    import mlx.core as mx

    mine = _nice(threading.get_native_id())
    before = _tasks()
    lowered = EngineThread("test-lowered", nice=7)

    def job() -> int:
        mx.eval(mx.ones(8) * 3)  # this thread's first op: MLX starts its stream's worker here
        return threading.get_native_id()

    tid = await lowered.run(job)
    started = _tasks() - before
    assert tid in started and len(started) >= 2  # the engine thread and MLX's worker for its stream
    assert {_nice(t) for t in started} == {mine + 7}
    assert _nice(threading.get_native_id()) == mine
    plain = EngineThread("test-plain")
    assert _nice(await plain.run(threading.get_native_id)) == mine
