"""message_start's usage when the first token is slow (a queue, a long prefill): pings keep the stream alive until
the row's first delta says how much of the prompt the prefix cache gave, then message_start carries that split."""

from __future__ import annotations

import anyio
import pytest

from service.app import create_app
from service.config import ServiceConfig
from service.state import AppState
from tests.service.asgi import ASGIClient, asgi_scope
from tests.service.fake_engine import FakeEngine
from tests.service.sse_events import named_events

USER = [{"role": "user", "content": "weather?"}]


@pytest.mark.anyio
@pytest.mark.parametrize("tools", [False, True])  # with tools the reply is read through a task (may go quiet)
async def test_a_slow_first_token_gets_pings_then_message_start_with_the_cached_split(
        monkeypatch: pytest.MonkeyPatch, tools: bool) -> None:
    # message_start went out as the first keep-alive, before the first token: a queued prompt's read 0 cached and
    # all of it as input_tokens there, while message_delta said otherwise (Claude Code shows message_start's).
    from service.chat import respond

    monkeypatch.setattr(respond, "FIRST_BYTE_WAIT", 0.01)
    engine = FakeEngine(pieces=["a", "b"])
    engine.cached_tokens = 7
    engine.first_gate = anyio.Event()
    body = {"model": "fake-model", "messages": USER, "max_tokens": 2, "stream": True,
            **({"tools": [{"name": "f", "input_schema": {"type": "object"}}]} if tools else {})}
    client = ASGIClient(body, marker=b"event: ping\n")
    with anyio.fail_after(30):  # without a keep-alive nothing is sent before the gate opens: fail, do not hang
        async with anyio.create_task_group() as tg:
            app = create_app(AppState(engine=engine, ready=True, task_group=tg,
                                      config=ServiceConfig(sse_keepalive=0.01)))
            tg.start_soon(app, asgi_scope("/v1/messages"), client.receive, client.send)
            await client.first.wait()  # a ping went out while the first token waited
            assert b"message_start" not in b"".join(client.chunks)
            engine.first_gate.set()
            await client.leave.wait()
    events = named_events(b"".join(client.chunks).decode())
    kinds = [e["type"] for e in events]
    assert kinds[0] == "ping" and kinds.count("message_start") == 1, kinds
    assert kinds[-2:] == ["message_delta", "message_stop"], kinds
    prompt = len(engine.requests[-1].prompt_tokens)
    start = next(e for e in events if e["type"] == "message_start")["message"]["usage"]
    end = events[-2]["usage"]
    assert (start["input_tokens"], start["cache_read_input_tokens"]) == (prompt - 7, 7)
    assert (end["input_tokens"], end["cache_read_input_tokens"]) == (prompt - 7, 7)


@pytest.mark.anyio
async def test_a_failure_before_the_first_token_still_opens_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    # After pings and no message_start, the SDKs' accumulators need message_start before the error's message_delta.
    from service.chat import respond

    monkeypatch.setattr(respond, "FIRST_BYTE_WAIT", 0.01)
    engine = FakeEngine(pieces=["a", "b"])
    engine.first_gate, engine.fail_with, engine.fail_at = anyio.Event(), "the step failed", 0
    client = ASGIClient({"model": "fake-model", "messages": USER, "max_tokens": 2, "stream": True},
                        marker=b"event: ping\n")
    app = create_app(AppState(engine=engine, ready=True, config=ServiceConfig(sse_keepalive=0.01)))
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(app, asgi_scope("/v1/messages"), client.receive, client.send)
            await client.first.wait()
            engine.first_gate.set()
            await client.leave.wait()
    kinds = [e["type"] for e in named_events(b"".join(client.chunks).decode())]
    assert kinds[0] == "ping" and kinds[-3:] == ["message_start", "message_delta", "error"], kinds
