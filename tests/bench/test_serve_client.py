"""The load client against a scripted in-process SSE server: parsing, failures, hang-ups, timeouts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from bench.serve_client import chat_body, responses_body, stream_chat
from bench.serve_procs import session_pids, session_rss
from bench.serve_prompts import PromptMaker

URL = "http://bench.test/v1/chat/completions"


def _chunk(content: str | None = None, usage: dict[str, int] | None = None) -> bytes:
    body: dict[str, Any] = {"choices": [] if content is None else [{"index": 0, "delta": {"content": content}}]}
    if usage:
        body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n".encode()


def sse_app(events: list[bytes], status: int = 200, hang: bool = False) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for e in events:
            await send({"type": "http.response.body", "body": e, "more_body": True})
        if hang:  # a server that stops answering mid-stream
            await anyio.Event().wait()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


async def _run(app: Any, timeout: float = 30.0, disconnect_after: int | None = None):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as client:
        return await stream_chat(client, URL, chat_body("s", "u", 8), timeout, disconnect_after)


@pytest.mark.anyio
async def test_coalesced_chunks_and_usage_are_read() -> None:
    events = [_chunk("Hel"), _chunk("lo wor"), _chunk(""), _chunk("ld"), _chunk(None, {"completion_tokens": 5, "prompt_tokens": 9}),
              b"data: [DONE]\n\n"]
    r = await _run(sse_app(events))
    assert r.ok and r.chunk_texts == ["Hel", "lo wor", "ld"] and len(r.chunk_times) == 3
    assert (r.completion_tokens, r.prompt_tokens) == (5, 9)
    r.count_tokens(lambda t: len(t.split()))  # estimates 1, 2, 1 → scaled to the 5 of usage
    assert r.chunk_tokens == [1, 3, 1] and r.output_tokens == 5


@pytest.mark.anyio
async def test_every_failure_is_named() -> None:
    error = b'data: {"error": {"message": "engine failed", "type": "server_error"}}\n\n'
    assert (await _run(sse_app([_chunk("a"), error, b"data: [DONE]\n\n"]))).error.startswith("error_event")
    r = await _run(sse_app([b'{"error": {"message": "no"}}'], status=500))
    assert r.error.startswith("http_500") and r.status == 500
    assert (await _run(sse_app([_chunk("a")]))).error.startswith("no_done")
    empty = await _run(sse_app([_chunk(None, {"completion_tokens": 0, "prompt_tokens": 0}), b"data: [DONE]\n\n"]))
    assert empty.error.startswith("empty")
    assert (await _run(sse_app([b"data: {not json\n\n"]))).error.startswith("bad_event")


def _event(kind: str, **fields: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()


@pytest.mark.anyio
async def test_a_responses_stream_is_read_to_its_completed_event() -> None:
    usage = {"input_tokens": 9, "output_tokens": 3}
    events = [_event("response.created", response={}), _event("response.output_text.delta", delta="Hel"),
              _event("response.output_text.delta", delta="lo"), _event("response.completed", response={"usage": usage})]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=sse_app(events))) as client:
        r = await stream_chat(client, "http://bench.test/v1/responses", responses_body("s", "u", 8), 30.0)
    assert r.ok and r.chunk_texts == ["Hel", "lo"] and (r.completion_tokens, r.prompt_tokens) == (3, 9)
    failed = [_event("response.output_text.delta", delta="a"), _event("response.failed", response={"error": {}})]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=sse_app(failed))) as client:
        r = await stream_chat(client, "http://bench.test/v1/responses", responses_body("s", "u", 8), 30.0)
    assert r.error is not None and r.error.startswith("error_event")


@pytest.mark.anyio
async def test_a_stalled_stream_times_out_instead_of_hanging() -> None:
    r = await _run(sse_app([_chunk("a")], hang=True), timeout=0.2)
    assert r.error is not None and r.error.startswith("timeout") and not r.ok


@pytest.mark.anyio
async def test_disconnect_after_n_chunks_is_not_a_failure() -> None:
    events = [_chunk(c) for c in "abcdef"] + [b"data: [DONE]\n\n"]
    r = await _run(sse_app(events), disconnect_after=2)
    assert r.ok and r.disconnected and r.chunk_texts == ["a", "b"]


def test_prompts_are_distinct_and_near_the_asked_length(tiny_llm_dir: Path) -> None:
    maker = PromptMaker(tiny_llm_dir, seed=0)
    assert maker.calibrated and maker.tokens_of is not None and maker.template_tokens > 0
    firsts = set()
    for i in range(20):
        system, user = maker.make(i, 300, "c8")
        firsts.add(system.split()[0:3].__str__())
        total = maker.tokens_of(system) + maker.tokens_of(user) + maker.template_tokens
        assert abs(total - 300) <= 15
    assert len(firsts) == 20
    assert maker.make(3, 300, "c8") == maker.make(3, 300, "c8")  # seeded: both servers get the same prompts
    assert maker.make(3, 300, "c8") != maker.make(3, 300, "c64")


def test_session_rss_reads_proc_for_this_session() -> None:
    sid = os.getsid(0)
    assert os.getpid() in session_pids(sid)
    assert session_rss(sid) > 10 * 1024 * 1024  # this Python process alone holds more than 10 MB


@pytest.mark.anyio
async def test_a_refused_connection_is_retried_only_when_asked() -> None:
    calls = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) <= 2:  # reset before any header, as a full accept queue does: both first attempts
            raise httpx.ReadError("connection reset", request=request)
        return httpx.Response(200, content=_chunk("a") + b"data: [DONE]\n\n")

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        failed = await stream_chat(client, URL, chat_body("s", "u", 8), 30.0)
        retried = await stream_chat(client, URL, chat_body("s", "u", 8), 30.0, retries=1)
    assert failed.error is not None and "before the response headers" in failed.error
    assert retried.ok and retried.retries == 1 and retried.chunk_texts == ["a"]
