"""kept_alive_while_idle: a stream that goes quiet after its first event still sends a keep-alive each interval."""

from __future__ import annotations

from typing import AsyncGenerator

import anyio
import pytest

from service.http.idle_keepalive import kept_alive_while_idle

KEEPALIVE = b": keep-alive\n\n"


async def _gated(gate: anyio.Event, closed: anyio.Event, fail: bool = False) -> AsyncGenerator[bytes, None]:
    """One event, then silence until `gate`, then another (or a failure); `closed` tells it was closed."""
    try:
        yield b"first"
        await gate.wait()
        if fail:
            raise RuntimeError("the row failed")
        yield b"second"
    finally:
        closed.set()


@pytest.mark.anyio
async def test_a_quiet_stream_gets_keep_alives_after_its_first_event() -> None:
    gate, closed = anyio.Event(), anyio.Event()
    got: list[bytes] = []
    with anyio.fail_after(30):  # without keep-alives the silence never ends: fail, do not hang
        async with anyio.create_task_group() as tg:
            stream = kept_alive_while_idle(_gated(gate, closed), lambda: KEEPALIVE, 0.01, tg)
            async for event in stream:
                got.append(event)
                if got.count(KEEPALIVE) == 2:
                    gate.set()  # two keep-alives came while the source was silent
    assert got[0] == b"first" and got[-1] == b"second"
    assert set(got[1:-1]) == {KEEPALIVE} and len(got) >= 4
    assert closed.is_set()


@pytest.mark.anyio
async def test_a_busy_stream_gets_none() -> None:
    async def busy() -> AsyncGenerator[bytes, None]:
        for i in range(200):
            yield b"%d" % i

    async with anyio.create_task_group() as tg:
        got = [event async for event in kept_alive_while_idle(busy(), lambda: KEEPALIVE, 60.0, tg)]
    assert got == [b"%d" % i for i in range(200)]


@pytest.mark.anyio
async def test_a_failure_of_the_source_is_raised_where_the_stream_is_read() -> None:
    gate, closed = anyio.Event(), anyio.Event()
    gate.set()
    got: list[bytes] = []
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            with pytest.raises(RuntimeError, match="the row failed"):
                async for event in kept_alive_while_idle(_gated(gate, closed, fail=True), lambda: KEEPALIVE, 60, tg):
                    got.append(event)
    assert got == [b"first"] and closed.is_set()


@pytest.mark.anyio
async def test_closing_the_stream_closes_its_source() -> None:
    # A client that left: the source (which owns the engine row, or a file's Whisper steps) is closed where it waits,
    # not left running to its next event.
    gate, closed = anyio.Event(), anyio.Event()
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            stream = kept_alive_while_idle(_gated(gate, closed), lambda: KEEPALIVE, 60, tg)
            assert await stream.__anext__() == b"first"
            await stream.aclose()
            await closed.wait()  # the gate never opens
    assert not gate.is_set()
