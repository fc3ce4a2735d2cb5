"""Tie a non-streamed request's work to the client connection: cancel it when the client leaves."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, TypeVar

import anyio
from litestar import Request

__all__ = ["ClientDisconnected", "run_while_connected"]

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client went away before a non-streamed response was ready."""


async def run_while_connected(request: Request[Any, Any, Any], work: Callable[[], Awaitable[T]]) -> T:
    """Run `work` in its own cancel scope, cancelled when the client disconnects.

    Raises ClientDisconnected when the client left first; re-raises whatever `work` raises."""
    box: list[T] = []
    failure: list[BaseException] = []

    async def watch(scope: anyio.CancelScope) -> None:
        # After the body is read, the next ASGI message is http.disconnect (when the client leaves).
        for _ in range(1000):
            message = await request.receive()
            if message["type"] == "http.disconnect":
                scope.cancel()
                return
        # A server that keeps answering with something else: stop watching rather than spin.

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch, tg.cancel_scope)
        try:
            box.append(await work())
        except Exception as exc:  # re-raised bare below, not wrapped in an ExceptionGroup
            failure.append(exc)
        tg.cancel_scope.cancel()
    if failure:
        raise failure[0]
    if not box:
        raise ClientDisconnected()
    return box[0]
