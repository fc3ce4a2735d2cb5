"""Objects used across the engine connection by reference (`--isolate`): the API process calls the methods of
objects that live in the engine process — the SpeechService and its live sessions — as if they were local.

The engine process registers an object and sends a `Ref`: its handle and, for each public method or property,
how it is called: "call" (a plain method: the caller blocks for the reply), "await" (a coroutine), "iter" (an
async generator: items stream back one message each) or "get" (a property). Results that are themselves
served by reference (a LiveSession from create_session) come back as new Refs; everything else by value.
Errors come back typed (messages.ErrorInfo) and are raised on the caller's side.

A plain method blocks the API process's event loop until the reply: the engine process answers from its own
event loop, between engine steps, in about a millisecond. `CALL_TIMEOUT` bounds it when that process is gone.
"""

from __future__ import annotations

import inspect
import itertools
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from engine.errors import EngineRestarting
from service.isolate.messages import ErrorInfo

__all__ = ["Ref", "Call", "Reply", "Item", "End", "ObjectServer", "ObjectClient", "RemoteObject", "CALL_TIMEOUT"]

CALL_TIMEOUT = 30.0  # seconds a plain call may wait for the engine process


@dataclass
class Ref:
    """An object living in the engine process: its handle, which server holds it (a restarted engine
    process is another server: its handles mean other objects) and how each member is called."""

    handle: int
    kind: str
    members: dict[str, str] = field(default_factory=dict)
    owner: int = 0


@dataclass
class Call:
    cid: int
    handle: int
    name: str
    how: str  # call | await | iter | get | release
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    owner: int = 0


@dataclass
class Reply:
    cid: int
    value: Any = None
    error: ErrorInfo | None = None


@dataclass
class Item:
    cid: int
    value: Any


@dataclass
class End:
    cid: int
    error: ErrorInfo | None = None


def _members(obj: Any) -> dict[str, str]:
    out = {name: "get" for name in getattr(obj, "__dict__", {}) if not name.startswith("_")}
    for name, member in inspect.getmembers(type(obj)):
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            out[name] = "get"
        elif inspect.isasyncgenfunction(member):
            out[name] = "iter"
        elif inspect.iscoroutinefunction(member):
            out[name] = "await"
        elif callable(member):
            out[name] = "call"
    return out


class ObjectServer:
    """The engine process's side: the objects it serves, and the answers to calls on them."""

    def __init__(self, send: Callable[[object], None], by_reference: Callable[[Any], bool],
                 gone: Callable[[], Exception] = lambda: LookupError("that object is gone")) -> None:
        """`by_reference(value)`: whether a result is served by reference rather than sent by value;
        `gone()`: the error for a call on an object this process does not hold (one from before a restart)."""
        self.send = send
        self.by_reference = by_reference
        self.gone = gone
        self.owner = secrets.randbits(62)
        self._objects: dict[int, Any] = {}
        self._handles = itertools.count(1)

    def register(self, obj: Any) -> Ref:
        """Serve `obj`; returns the Ref to send. Raises nothing."""
        handle = next(self._handles)
        self._objects[handle] = obj
        return Ref(handle, type(obj).__name__, _members(obj), self.owner)

    async def handle(self, call: Call) -> None:
        """Answer one call (run it in its own task: iterators and coroutines take time). Raises nothing."""
        if call.owner != self.owner:  # from a proxy of a server (engine process) before this one
            if call.how != "release":
                error = ErrorInfo.of(self.gone())
                self.send(End(call.cid, error) if call.how == "iter" else Reply(call.cid, error=error))
            return
        obj = self._objects.get(call.handle)
        if call.how == "release":
            self._objects.pop(call.handle, None)
            return
        try:
            if obj is None:
                raise self.gone()
            member = getattr(obj, call.name)
            if call.how == "iter":
                async for value in member(*call.args, **call.kwargs):
                    self.send(Item(call.cid, self._wrap(value)))
                self.send(End(call.cid))
                return
            value = member if call.how == "get" else member(*call.args, **call.kwargs)
            if call.how == "await":
                value = await value
            self.send(Reply(call.cid, self._wrap(value)))
        except Exception as exc:  # the caller gets it, typed
            self.send((End if call.how == "iter" else Reply)(call.cid, error=ErrorInfo.of(exc)))

    def _wrap(self, value: Any) -> Any:
        return self.register(value) if self.by_reference(value) else value


class ObjectClient:
    """The API process's side: proxies for Refs, and the replies they wait for."""

    def __init__(self, send: Callable[[object], None], ready: Callable[[], bool] = lambda: True) -> None:
        """`ready()`: whether the engine process can answer now (calls fail at once while it restarts)."""
        self.send = send
        self.ready = ready
        self._cids = itertools.count(1)
        self._waiting: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._streams: dict[int, MemoryObjectSendStream[Any]] = {}
        self._lock = threading.Lock()
        # Set by fail_all until reopen(): a call made after the relay saw the connection end (before the event
        # loop learns it) would wait for a reply that never comes, blocking the loop for CALL_TIMEOUT.
        self._gone: ErrorInfo | None = None

    def reopen(self) -> None:
        """A new engine process is connected: calls go out again. Raises nothing."""
        with self._lock:
            self._gone = None

    def proxy(self, ref: Ref) -> "RemoteObject":
        return RemoteObject(self, ref)

    def deliver(self, message: object, on_loop: Callable[[Callable[[], None]], object]) -> bool:
        """Relay thread: take a reply or item if it is one of ours (True), else leave it (False). Replies to
        plain calls are handed over here, since their caller blocks the event loop; the rest go through
        `on_loop`. Raises nothing."""
        if isinstance(message, Reply):
            with self._lock:
                waiter = self._waiting.pop(message.cid, None)
            if waiter is not None:
                waiter[1].append(message)
                waiter[0].set()
            elif message.cid in self._streams:  # a coroutine's reply
                on_loop(lambda: self._feed(message))
            return True
        if isinstance(message, (Item, End)):
            stream = self._streams.get(message.cid)
            if stream is not None:
                on_loop(lambda: self._feed(message))
            return True
        return False

    def fail_all(self, reason: str, kind: str = "EngineRestarting") -> None:
        """The engine process is gone: every waiting call and stream ends, and later ones fail, with the error
        `kind` names (engine.errors or audio.errors): EngineRestarting where it died, SpeechStopped where the
        server shut it down. Raises nothing."""
        gone = ErrorInfo(kind, reason, fields={"retry_after": 10} if kind == "EngineRestarting" else {})
        with self._lock:
            self._gone = gone
            waiting, self._waiting = self._waiting, {}
            streams, self._streams = self._streams, {}
        for event, box in waiting.values():
            box.append(Reply(0, error=gone))
            event.set()
        for stream in streams.values():
            try:
                stream.send_nowait(End(0, gone))
            except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass

    # -- calls ------------------------------------------------------------------------------------

    def call(self, ref: Ref, name: str, how: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A plain call or property: blocks until the reply. Raises the remote error, EngineRestarting."""
        self._check_ready()
        cid = next(self._cids)
        event = threading.Event()
        box: list[Any] = []
        with self._lock:
            self._check_open()
            self._waiting[cid] = (event, box)
        self.send(Call(cid, ref.handle, name, how, args, kwargs, ref.owner))
        if not event.wait(CALL_TIMEOUT):
            with self._lock:
                self._waiting.pop(cid, None)
            raise EngineRestarting(f"the engine process did not answer {name}() in {CALL_TIMEOUT:g} s")
        return self._result(box[0])

    async def call_async(self, ref: Ref, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A coroutine method: awaits the reply without blocking the loop. Raises the remote error."""
        self._check_ready()
        cid = next(self._cids)
        send, receive = anyio.create_memory_object_stream[Any](1)
        self._open_stream(cid, send)
        self.send(Call(cid, ref.handle, name, "await", args, kwargs, ref.owner))
        try:
            return self._result(await receive.receive())
        finally:
            self._streams.pop(cid, None)

    async def iterate(self, ref: Ref, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        """An async generator method: its items as they come. Raises the remote error at its end."""
        self._check_ready()
        cid = next(self._cids)
        send, receive = anyio.create_memory_object_stream[Any](1 << 16)
        self._open_stream(cid, send)
        self.send(Call(cid, ref.handle, name, "iter", args, kwargs, ref.owner))
        try:
            while True:
                message = await receive.receive()
                if isinstance(message, Item):
                    yield self.proxy(message.value) if isinstance(message.value, Ref) else message.value
                    continue
                if isinstance(message, (End, Reply)) and message.error is not None:
                    raise message.error.exception()
                return
        finally:
            self._streams.pop(cid, None)

    def release(self, ref: Ref) -> None:
        """The proxy is gone: the engine process may drop its object. Raises nothing."""
        try:
            self.send(Call(0, ref.handle, "", "release", owner=ref.owner))
        except Exception:  # the connection is gone with the object
            pass

    def _open_stream(self, cid: int, send: MemoryObjectSendStream[Any]) -> None:
        with self._lock:
            self._check_open()
            self._streams[cid] = send

    def _check_open(self) -> None:
        """Under the lock. Raises fail_all's error (EngineRestarting, SpeechStopped) after it until reopen()."""
        if (gone := self._gone) is not None:
            raise gone.exception()

    def _check_ready(self) -> None:
        self._check_open()  # a server shut down says so, not that it restarts
        if not self.ready():
            raise EngineRestarting("The engine process is restarting; try again shortly.", retry_after=10)

    def _feed(self, message: Item | End | Reply) -> None:
        stream = self._streams.get(message.cid)
        if stream is not None:
            try:
                stream.send_nowait(message)
            except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass

    def _result(self, message: Reply | End) -> Any:
        if message.error is not None:
            raise message.error.exception()
        value = getattr(message, "value", None)
        return self.proxy(value) if isinstance(value, Ref) else value


class RemoteObject:
    """A local stand-in for an object in the engine process (see module doc)."""

    def __init__(self, client: ObjectClient, ref: Ref) -> None:
        self._client = client
        self._ref = ref

    def __getattr__(self, name: str) -> Any:
        ref = self.__dict__.get("_ref")
        how = ref.members.get(name) if ref is not None else None
        client = self._client
        if ref is None or how is None:
            raise AttributeError(f"{ref.kind if ref else 'object'} has no served member {name!r}")
        if how == "get":
            return client.call(ref, name, "get", (), {})
        if how == "await":
            return lambda *args, **kwargs: client.call_async(ref, name, args, kwargs)
        if how == "iter":
            return lambda *args, **kwargs: client.iterate(ref, name, args, kwargs)
        return lambda *args, **kwargs: client.call(ref, name, "call", args, kwargs)

    def __del__(self) -> None:
        if "_ref" in self.__dict__:
            self._client.release(self._ref)
