"""OpenBLAS's thread count follows chat (engine/blas_threads.py): every core while no chat row runs, all but one
while chat decodes; a user's OPENBLAS_NUM_THREADS stands."""

from __future__ import annotations

import anyio
import pytest

from engine import backend, blas_threads
from engine.contracts import GenerationRequest
from tests.engine.test_batch import GREEDY, prompt_of


class FakeOpenBLAS:
    """The two calls blas_threads makes, recorded."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.set: list[int] = []
        self.changed = anyio.Event()  # set at each change (the driver calls from the event loop)

    def openblas_set_num_threads(self, n) -> None:
        self.threads = n.value
        self.set.append(n.value)
        self.changed.set()

    async def change(self) -> None:
        """Until the next change (at most 10 s)."""
        with anyio.fail_after(10):
            await self.changed.wait()
        self.changed = anyio.Event()

    def openblas_get_num_threads(self) -> int:
        return self.threads


@pytest.fixture
def fake_blas(monkeypatch) -> FakeOpenBLAS:
    fake = FakeOpenBLAS(1)
    monkeypatch.setattr(backend, "_handle", fake)
    monkeypatch.setattr(backend, "cores", lambda: 2)
    monkeypatch.setenv(backend.DEFAULTED_THREADS, "1")
    monkeypatch.setattr(blas_threads, "_current", None)
    return fake


def test_every_core_without_chat_and_one_left_to_the_loop_with_it(fake_blas) -> None:
    blas_threads.follow_chat(False)
    assert blas_threads.threads_now() == 2
    blas_threads.follow_chat(False)  # unchanged: no call
    blas_threads.follow_chat(True)
    assert blas_threads.threads_now() == 1 and fake_blas.set == [2, 1]


def test_a_users_thread_count_stands(fake_blas, monkeypatch) -> None:
    monkeypatch.delenv(backend.DEFAULTED_THREADS)  # OPENBLAS_NUM_THREADS came from the user
    blas_threads.follow_chat(False)
    assert fake_blas.set == [] and blas_threads.threads_now() == 1


def test_without_openblas_nothing_happens(monkeypatch) -> None:
    monkeypatch.setattr(backend, "_handle", None)
    blas_threads.follow_chat(False)
    assert blas_threads.threads_now() is None


@pytest.mark.anyio
async def test_the_driver_takes_a_core_back_for_chat_and_frees_it_when_idle(tiny_loaded, fake_blas) -> None:
    from engine.runtime import Engine

    engine = Engine(tiny_loaded, memory_budget=1 << 30)
    seen: list[int] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        await fake_blas.change()
        assert fake_blas.set == [2]  # idle: every core
        async with engine.submit(GenerationRequest(prompt_of(5, 1), GREEDY, max_tokens=6)) as stream:
            async for _ in stream:
                seen.append(fake_blas.threads)  # chat steps ran with one core left to the loop
        while fake_blas.threads != 2:  # idle again: the driver gives the core back before it sleeps
            await fake_blas.change()
        engine.close()
    assert seen and set(seen) == {1} and fake_blas.set == [2, 1, 2]


def test_the_real_openblas_follows_when_ours_and_defaulted() -> None:
    import os

    if backend._handle is None or os.environ.get(backend.DEFAULTED_THREADS) != "1" or backend.cores() < 2:
        pytest.skip("needs our OpenBLAS with its default thread count on 2+ cores")
    try:
        blas_threads.follow_chat(False)
        assert blas_threads.threads_now() == backend.cores()
        blas_threads.follow_chat(True)
        assert blas_threads.threads_now() == backend.cores() - 1
    finally:
        blas_threads.follow_chat(True)


@pytest.mark.anyio
async def test_an_engine_without_a_chat_model_gives_its_tasks_every_core(fake_blas) -> None:
    from engine.runtime import Engine

    engine = Engine(None)  # speech only (`tandem transcribe`)
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        await fake_blas.change()
        engine.close()
    assert fake_blas.set == [2]
