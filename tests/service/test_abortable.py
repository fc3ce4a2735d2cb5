"""run_abortable: work stopped on cancellation, and a limiter released at once when the work never started."""

from __future__ import annotations

import logging
import threading

import anyio
import pytest

from service import abortable
from service.abortable import Aborted, run_abortable

pytestmark = pytest.mark.anyio


async def test_cancelled_before_any_thread_took_it_releases_the_limiter_without_waiting(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # A client leaving before a worker thread picks its render up: nothing will ever set `stopped`, and the
    # caller used to hold the shared tokenize limiter for the whole unwind wait (30 s of every chat route).
    monkeypatch.setattr(abortable, "_UNWIND_SECONDS", 0.2)
    threads = anyio.to_thread.current_default_thread_limiter()
    saved, ran = threads.total_tokens, threading.Event()
    shared = anyio.CapacityLimiter(1)
    threads.total_tokens = 1
    try:
        await threads.acquire()  # no worker thread free: the call waits before any thread has it
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                async def call() -> None:
                    with pytest.raises(anyio.get_cancelled_exc_class()):
                        await run_abortable(ran.set, timeout=60, limiter=shared)
                tg.start_soon(call)
                await anyio.wait_all_tasks_blocked()
                scope.cancel()
                threads.release()  # a thread is free again before the caller decides whether to wait
        assert shared.borrowed_tokens == 0
    finally:
        threads.total_tokens = saved
    assert not ran.is_set()
    assert "did not stop" not in caplog.text


async def test_running_work_is_interrupted_and_waited_for() -> None:
    started, finished = threading.Event(), threading.Event()
    shared = anyio.CapacityLimiter(1)

    def spin() -> None:
        started.set()
        try:
            while True:  # pure Python: the async exception lands between bytecodes
                pass
        finally:
            finished.set()

    with pytest.raises(TimeoutError):
        await run_abortable(spin, timeout=0.05, limiter=shared)
    assert started.is_set() and finished.is_set()  # the thread had unwound before the limiter was released
    assert shared.borrowed_tokens == 0


def test_abort_says_whether_there_is_work_to_wait_for() -> None:
    call = abortable._Call(lambda: 1, ())
    assert call.abort() is False
    with pytest.raises(Aborted):  # a thread taking it up after the abort does not run it
        call.run()
    assert call.stopped.is_set()
