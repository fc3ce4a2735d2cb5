"""OpenBLAS's thread count follows the machine (engine/blas_threads.py): every core while nothing computes, all but
one while chat decodes beside other work (Whisper windows, another busy process) or speech runs beside another busy
process, every core again while chat or speech has a quiet machine to itself; a user's OPENBLAS_NUM_THREADS stands."""

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
    monkeypatch.setattr(blas_threads, "_chat", False)
    monkeypatch.setattr(blas_threads, "_speech", False)
    monkeypatch.setattr(blas_threads, "_speech_ended", -1e9)
    monkeypatch.setattr(blas_threads, "_next_check", 0.0)
    monkeypatch.setattr(blas_threads, "others", blas_threads.OtherLoad(machine=lambda: None))  # never quiet
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


def test_the_real_openblas_follows_when_ours_and_defaulted(monkeypatch) -> None:
    import os

    if backend._handle is None or os.environ.get(backend.DEFAULTED_THREADS) != "1" or backend.cores() < 2:
        pytest.skip("needs our OpenBLAS with its default thread count on 2+ cores")
    monkeypatch.setattr(blas_threads, "others", blas_threads.OtherLoad(machine=lambda: None))  # chat shares it
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


class Clock:
    """Seconds of the machine's busy time and of this process's own, moved by hand."""

    def __init__(self) -> None:
        self.machine = 100.0
        self.own = 10.0

    def spend(self, machine: float, own: float) -> None:
        self.machine += machine
        self.own += own


def test_other_load_is_the_machines_busy_time_less_this_processs_own() -> None:
    clock = Clock()
    load = blas_threads.OtherLoad(interval=1.0, machine=lambda: clock.machine, own=lambda: clock.own)
    assert not load.sample(0.0) and not load.quiet  # a first reading: nothing to compare yet
    clock.spend(1.9, 1.85)  # both cores busy, all of it ours
    assert not load.sample(0.5)  # within the interval: no sample
    assert load.sample(1.0) and load.quiet and load.cores == pytest.approx(0.05)
    clock.spend(2.0, 1.0)  # another process took a core
    assert load.sample(2.0) and not load.quiet and load.cores == pytest.approx(1.0)
    assert not blas_threads.OtherLoad(machine=lambda: None).sample(5.0)  # no /proc: never quiet


def _fake_machine(monkeypatch) -> "Clock":
    """The machine's load read from a Clock the test moves, and a monotonic clock ticking a second a call."""
    clock = Clock()
    load = blas_threads.OtherLoad(interval=1.0, machine=lambda: clock.machine, own=lambda: clock.own)
    monkeypatch.setattr(blas_threads, "others", load)
    times = iter(float(t) for t in range(100))
    monkeypatch.setattr(blas_threads.time, "monotonic", lambda: next(times))
    return clock


def test_chat_gets_every_core_only_on_a_quiet_machine_without_speech(fake_blas, monkeypatch) -> None:
    clock = _fake_machine(monkeypatch)
    blas_threads.follow_chat(True)
    assert fake_blas.threads == 1  # not yet known to be quiet
    blas_threads.recheck()  # first reading
    clock.spend(1.0, 0.98)
    blas_threads.recheck()
    assert fake_blas.threads == 2  # quiet: chat takes both cores
    blas_threads.follow_chat(True, wide=False)
    assert fake_blas.threads == 1  # one or two rows decoding: GEMVs, which a second thread does not speed up
    blas_threads.follow_chat(True)
    blas_threads.follow_speech(True)
    assert fake_blas.threads == 1  # a Whisper window: a core back for the loop
    blas_threads.follow_speech(False)
    assert fake_blas.threads == 1  # speech still counts for a while after its last window
    for _ in range(6):
        clock.spend(1.0, 0.98)
        blas_threads.recheck()
    assert fake_blas.threads == 2
    clock.spend(1.0, 0.2)  # another process got busy
    blas_threads.recheck()
    assert fake_blas.threads == 1 and fake_blas.set == [1, 2, 1, 2, 1, 2, 1]


def test_speech_alone_leaves_a_core_while_another_process_is_busy(fake_blas, monkeypatch) -> None:
    # No chat row: speech's products wait on a descheduled BLAS thread as chat's do (live first words 7.7 s, not 1 s).
    clock = _fake_machine(monkeypatch)
    blas_threads.follow_chat(False)
    assert fake_blas.threads == 2  # nothing computes
    blas_threads.follow_speech(True)
    assert fake_blas.threads == 1  # a Whisper window, the machine not yet known to be quiet
    blas_threads.recheck()  # first reading, sampled though no chat row runs
    clock.spend(1.0, 0.98)
    blas_threads.recheck()
    assert fake_blas.threads == 2  # quiet: speech takes both cores
    clock.spend(2.0, 1.0)  # another process took a core
    blas_threads.recheck()
    assert fake_blas.threads == 1 and fake_blas.set == [2, 1, 2, 1]


@pytest.mark.anyio
async def test_the_driver_gives_chat_every_core_on_a_quiet_machine(tiny_loaded, fake_blas, monkeypatch) -> None:
    from engine.runtime import Engine

    # The rest of the machine uses nothing: every sample finds it quiet (no interval, so each iteration samples).
    monkeypatch.setattr(blas_threads, "others", blas_threads.OtherLoad(interval=0.0, machine=lambda: 1.0,
                                                                        own=lambda: 1.0))
    engine = Engine(tiny_loaded, memory_budget=1 << 30)
    seen: list[int] = []

    async def one(salt: int) -> None:
        async with engine.submit(GenerationRequest(prompt_of(5, salt), GREEDY, max_tokens=12)) as stream:
            async for _ in stream:
                seen.append(fake_blas.threads)

    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        async with anyio.create_task_group() as rows:  # three rows: wider than the GEMV shim's two
            for salt in (1, 2, 3):
                rows.start_soon(one, salt)
        engine.close()
    # One core back as chat began (the machine not yet sampled), both once it read quiet.
    assert seen[0] == 1 and 2 in seen
