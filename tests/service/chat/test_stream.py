"""service/chat/stream.py RowReader: deltas already waiting are read at once (no timeout scope per token),
and the request deadline still ends the stream with a 504 whether deltas wait or not."""

from __future__ import annotations

import time

import anyio
import pytest

from engine.contracts import Delta
from service.chat import stream as stream_module
from service.chat.stream import RowReader, StreamTiming, UsageCounter
from service.http.errors import APIError

pytestmark = pytest.mark.anyio


class Deltas:
    """A RowStream over an anyio memory stream, as the engine's LLMRowStream is."""

    def __init__(self, *deltas: Delta, end: bool = True) -> None:
        self.send, self.receive = anyio.create_memory_object_stream[Delta](16)
        for d in deltas:
            self.send.send_nowait(d)
        if end:
            self.send.close()
        self.closed = False

    def __aiter__(self) -> "Deltas":
        return self

    async def __anext__(self) -> Delta:
        try:
            return await self.receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    def receive_nowait(self) -> Delta:
        return self.receive.receive_nowait()

    async def aclose(self) -> None:
        self.cancel()

    def cancel(self) -> None:
        self.closed = True
        self.receive.close()


def waiting_reader(seconds: float, *deltas: Delta) -> tuple[Deltas, RowReader]:
    """A reader of a row that stays open (the test sends the rest) and has its deadline `seconds` away."""
    rows = Deltas(*deltas, end=False)
    now = time.monotonic()
    return rows, RowReader(rows, UsageCounter(), StreamTiming(now, now + seconds))


async def read_all(reader: RowReader) -> list[tuple[str, str | None]]:
    await reader.start()
    return [item async for item in reader.items()]


async def test_deltas_already_waiting_are_read_without_a_timeout_scope(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_scope(*_args: object, **_kw: object) -> None:
        raise AssertionError("a timeout scope for a delta that was already waiting")

    monkeypatch.setattr(stream_module.anyio, "move_on_after", no_scope)
    rows = Deltas(Delta(text="a", token_ids=[1]), Delta(text="b", token_ids=[2], finish_reason="stop"))
    now = time.monotonic()
    items = await read_all(RowReader(rows, UsageCounter(), StreamTiming(now, now + 60.0)))
    assert "".join(t for t, _ in items) == "ab" and items[-1][1] == "stop"
    assert rows.closed


async def test_a_reader_waits_for_the_next_delta_within_the_deadline() -> None:
    rows, reader = waiting_reader(60.0)

    async def produce() -> None:
        await anyio.sleep(0)
        rows.send.send_nowait(Delta(text="x", token_ids=[1], finish_reason="length"))
        rows.send.close()

    async with anyio.create_task_group() as tg:
        tg.start_soon(produce)
        items = await read_all(reader)
    assert items == [("x", "length")]


async def test_past_the_deadline_the_reader_gives_504_even_with_deltas_waiting() -> None:
    rows = Deltas(Delta(text="a", token_ids=[1]), end=False)
    now = time.monotonic()
    with pytest.raises(APIError) as err:
        await read_all(RowReader(rows, UsageCounter(), StreamTiming(now - 2.0, now - 1.0)))
    assert err.value.status == 504 and rows.closed
    # The same request would run past the same deadline again: the SDKs must not retry it (they would, twice).
    assert err.value.headers["x-should-retry"] == "false"


async def test_past_the_deadline_a_waiting_reader_gives_504() -> None:
    rows = Deltas(end=False)
    now = time.monotonic()
    with pytest.raises(APIError) as err:
        await read_all(RowReader(rows, UsageCounter(), StreamTiming(now, now + 0.05)))
    assert err.value.status == 504 and rows.closed


async def test_a_waiting_reader_arms_one_timer_for_the_request_not_a_scope_per_delta(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def no_scope(*_args: object, **_kw: object) -> None:
        raise AssertionError("a timeout scope per read")

    monkeypatch.setattr(stream_module.anyio, "move_on_after", no_scope)
    rows, reader = waiting_reader(60.0)

    async def produce() -> None:
        for i in range(5):  # each delta arrives while the reader waits
            await anyio.sleep(0.001)
            rows.send.send_nowait(Delta(text=str(i), token_ids=[i], finish_reason="stop" if i == 4 else None))

    async with anyio.create_task_group() as tg:
        tg.start_soon(produce)
        items = await read_all(reader)
    assert "".join(t for t, _ in items) == "01234"
    assert reader._timer is not None and reader._timer.cancelled()  # disarmed when the stream ended


async def test_the_deadline_timer_cancels_the_row_and_the_waiting_reader_gives_504(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream_module.anyio, "move_on_after", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    rows, reader = waiting_reader(0.05, Delta(text="a", token_ids=[1]))
    await reader.start()
    items = reader.items()
    assert await items.__anext__() == ("a", None)
    with pytest.raises(APIError) as err:
        await items.__anext__()  # nothing more comes: the timer ends the wait
    assert err.value.status == 504 and rows.closed


async def test_a_reader_dropped_before_its_body_is_not_kept_until_the_deadline() -> None:
    import gc
    import weakref

    rows, reader = waiting_reader(600.0)

    async def produce() -> None:
        await anyio.sleep(0)
        rows.send.send_nowait(Delta(text="a", token_ids=[1]))

    async with anyio.create_task_group() as tg:
        tg.start_soon(produce)
        await reader.start()  # waited for its first delta: the deadline's timer is armed
    timer, ref = reader._timer, weakref.ref(reader)
    assert timer is not None and not timer.cancelled()
    del reader  # the client left before the body: items() never runs
    gc.collect()
    assert ref() is None  # the armed timer does not hold it for the next ten minutes
