"""Objects by reference across a connection: plain methods, properties, coroutines, async generators and
objects returned by reference, each answered by a server running its own event loop in another thread (as the
engine process does), errors raised typed on the caller's side."""

from __future__ import annotations

import asyncio
import threading
from multiprocessing import Pipe
from typing import AsyncIterator

import anyio
import pytest

from engine.errors import EngineRestarting, InvalidRequest
from service.isolate.objects import Call, ObjectClient, ObjectServer, RemoteObject, Reply

pytestmark = pytest.mark.anyio


class Counter:
    def __init__(self) -> None:
        self.n = 0
        self.label = "counter"

    @property
    def doubled(self) -> int:
        return 2 * self.n

    def add(self, k: int) -> int:
        self.n += k
        return self.n

    async def slow_add(self, k: int) -> int:
        await anyio.sleep(0)
        return self.add(k)

    async def count(self, upto: int) -> AsyncIterator[int]:
        for i in range(upto):
            yield i

    def child(self) -> "Counter":
        return Counter()

    def refuse(self) -> None:
        raise InvalidRequest("no such thing", param="thing")


@pytest.fixture
async def remote() -> AsyncIterator[RemoteObject]:
    """A Counter served from another thread's event loop, and the proxy for it on this one."""
    server_end, client_end = Pipe()

    def serve() -> None:
        async def main() -> None:
            server = ObjectServer(server_end.send, lambda value: isinstance(value, Counter))
            server_end.send(server.register(Counter()))
            async with anyio.create_task_group() as tg:
                while (call := await anyio.to_thread.run_sync(server_end.recv)) is not None:
                    tg.start_soon(server.handle, call)

        anyio.run(main)

    threading.Thread(target=serve, daemon=True).start()
    root = await anyio.to_thread.run_sync(client_end.recv)
    client = ObjectClient(client_end.send)
    loop = asyncio.get_running_loop()

    def relay() -> None:  # as the API process's relay thread does
        while True:
            try:
                message = client_end.recv()
            except (EOFError, OSError):
                return
            client.deliver(message, lambda fn: loop.call_soon_threadsafe(fn))

    threading.Thread(target=relay, daemon=True).start()
    yield client.proxy(root)
    client_end.send(None)


async def test_plain_calls_properties_and_attributes(remote: RemoteObject) -> None:
    assert remote.add(3) == 3 and remote.add(4) == 7
    assert remote.doubled == 14 and remote.label == "counter"


async def test_coroutines_and_async_generators(remote: RemoteObject) -> None:
    assert await remote.slow_add(5) == 5
    assert [i async for i in remote.count(4)] == [0, 1, 2, 3]


async def test_objects_come_back_by_reference(remote: RemoteObject) -> None:
    child = remote.child()
    assert isinstance(child, RemoteObject)
    child.add(10)
    assert child.n == 10 and remote.n == 0


async def test_errors_are_raised_typed(remote: RemoteObject) -> None:
    with pytest.raises(InvalidRequest, match="no such thing") as info:
        remote.refuse()
    assert info.value.param == "thing"
    with pytest.raises(AttributeError):
        remote.nothing_like_this  # noqa: B018


async def test_proxies_from_a_previous_server_never_reach_the_new_ones_objects() -> None:
    # A restarted engine process numbers its objects from 1 again: a proxy held from before the restart must
    # neither call nor release the new object that has its number.
    sent: list[object] = []
    old = ObjectServer(sent.append, lambda value: False)
    new = ObjectServer(sent.append, lambda value: False, gone=lambda: InvalidRequest("gone", param="session_id"))
    stale, current = old.register(Counter()), new.register(Counter())
    assert stale.handle == current.handle
    await new.handle(Call(1, stale.handle, "", "release", owner=stale.owner))
    await new.handle(Call(2, current.handle, "add", "call", (5,), owner=current.owner))
    await new.handle(Call(3, stale.handle, "add", "call", (1,), owner=stale.owner))
    replies = [m for m in sent if isinstance(m, Reply)]
    assert replies[0].cid == 2 and replies[0].value == 5  # the release from the stale proxy was ignored
    assert replies[1].cid == 3 and replies[1].error is not None and replies[1].error.kind == "InvalidRequest"


async def test_calls_after_the_connection_ended_fail_at_once_until_reopened(
        remote: RemoteObject, monkeypatch: pytest.MonkeyPatch) -> None:
    # Between the relay thread seeing the engine process die and the event loop learning it, a plain call
    # used to wait for a reply that never comes (blocking the loop), a coroutine or generator forever.
    monkeypatch.setattr("service.isolate.objects.CALL_TIMEOUT", 0.5)  # the old wait fails fast, with another message
    client = remote._client
    client.fail_all("The engine process exited; it is restarting.")
    with pytest.raises(EngineRestarting, match="exited"):
        remote.add(1)
    with anyio.fail_after(30):  # a hang guard, not a timing assertion
        with pytest.raises(EngineRestarting, match="exited"):
            await remote.slow_add(1)
        with pytest.raises(EngineRestarting, match="exited"):
            [i async for i in remote.count(2)]
    client.reopen()  # a new engine process is connected
    assert remote.add(2) == 2
