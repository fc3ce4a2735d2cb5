"""The service's own cost a streamed token: many chat streams from the fake engine (tests/service/fake_engine.py,
no model) through the ASGI app in one process, timed end to end, with keep-alives on or off.

    uv run python -m bench.stream_overhead --streams 64 --tokens 300 --rounds 3 [--tools]

`--tools` declares a tool, so the stream is read through the idle keep-alive task (service/http/idle_keepalive.py).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import anyio

from service.app import create_app
from service.config import ServiceConfig
from service.state import AppState
from tests.service.asgi import ASGIClient, asgi_scope
from tests.service.fake_engine import FakeEngine

_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


async def _run(streams: int, tokens: int, keepalive: float, tools: bool) -> float:
    engine = FakeEngine(pieces=["x"] * tokens, context_length=100_000)
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens, "stream": True}
    if tools:
        body["tools"] = _TOOLS
    async with anyio.create_task_group() as tg:
        app = create_app(AppState(engine=engine, ready=True, task_group=tg,
                                  config=ServiceConfig(sse_keepalive=keepalive)))
        clients = [ASGIClient(body) for _ in range(streams)]
        start = time.perf_counter()
        async with anyio.create_task_group() as inner:
            for client in clients:
                inner.start_soon(app, asgi_scope("/v1/chat/completions"), client.receive, client.send)
        took = time.perf_counter() - start
        tg.cancel_scope.cancel()
    if not all(b"[DONE]" in b"".join(c.chunks) for c in clients):
        raise SystemExit("a stream did not finish")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tools", action="store_true", help="declare a tool (the idle keep-alive reader)")
    args = parser.parse_args()
    for _ in range(args.rounds):
        for keepalive in (0.0, 2.0):
            took = anyio.run(_run, args.streams, args.tokens, keepalive, args.tools)
            print(f"--sse-keepalive {keepalive:g}: {took:.2f} s, "
                  f"{took / (args.streams * args.tokens) * 1e6:.1f} µs a token", flush=True)


if __name__ == "__main__":
    main()
