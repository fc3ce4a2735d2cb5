"""--sse-keepalive: how often a stream whose first token is slow sends keep-alives (an SSE comment; Anthropic's ping,
the Responses API's in_progress event) after its headers, and none at all at 0 — llmperf parses every non-blank
line of a stream as a JSON event."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from litestar.testing import TestClient

from service.app import create_app
from service.config import ServiceConfig
from service.state import STATE_KEY, AppState
from tests.service.asgi import ASGIClient, asgi_scope
from tests.service.conftest import sse_events
from tests.service.fake_engine import FakeEngine
from tests.service.sse_events import named_events

USER = [{"role": "user", "content": "hi"}]


class _Client(ASGIClient):
    """An ASGIClient that also tells when the headers went out and counts the chunks holding its marker."""

    def __init__(self, body: dict[str, Any], marker: bytes, count: int = 1) -> None:
        super().__init__(body, marker)
        self.headers_sent = anyio.Event()
        self.count, self.marked = count, 0
        self.counted = anyio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.headers_sent.set()
        elif self.marker in message.get("body", b""):
            self.marked += 1
            if self.marked >= self.count:
                self.counted.set()
        await super().send(message)


# One streamed request on each route that streams through respond() (and the choices' merged stream).
STREAMED_ROUTES = [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 2, "n": 2}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 16}),
    ("/v1/messages", {"model": "fake-model", "messages": USER, "max_tokens": 2}),
]


def _app(engine: FakeEngine, keepalive: float, task_group: Any = None) -> Any:
    return create_app(AppState(engine=engine, ready=True, task_group=task_group,
                               config=ServiceConfig(sse_keepalive=keepalive)))


def test_keep_alives_are_on_by_default() -> None:
    # README: clients with short read timeouts (httpx's 5 s) need them, so turning them off is the operator's choice.
    assert ServiceConfig().sse_keepalive == 2.0


@pytest.mark.anyio
@pytest.mark.parametrize("path,body", STREAMED_ROUTES)
@pytest.mark.parametrize("keepalive", [0, 0.01])
async def test_keep_alives_follow_sse_keepalive(monkeypatch: pytest.MonkeyPatch, path: str, body: dict[str, Any],
                                                keepalive: float) -> None:
    from service.chat import respond

    monkeypatch.setattr(respond, "FIRST_BYTE_WAIT", 0.01)
    engine, clock_engine = FakeEngine(pieces=["a", "b"]), FakeEngine(pieces=["a", "b"])
    engine.first_gate, clock_engine.first_gate = anyio.Event(), anyio.Event()
    client = _Client({**body, "stream": True}, marker=b"data: ")
    # The clock: a server sending keep-alives every 10 ms, started after the tested stream's headers went out. Both
    # run on one event loop, so by its third keep-alive the tested stream, at that period, sent two.
    clock = _Client({"messages": USER, "stream": True, "max_tokens": 2}, marker=b": keep-alive\n\n", count=3)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_app(engine, keepalive, tg), asgi_scope(path), client.receive, client.send)
            await client.headers_sent.wait()  # the first token still waits: headers go out after FIRST_BYTE_WAIT
            tg.start_soon(_app(clock_engine, 0.01), asgi_scope("/v1/chat/completions"), clock.receive, clock.send)
            await clock.counted.wait()
            # At 0: no comment, no ping, no early lifecycle event.
            assert bool(b"".join(client.chunks)) == (keepalive > 0), client.chunks
            engine.first_gate.set()
            clock_engine.first_gate.set()
            await client.leave.wait()
            await clock.leave.wait()
    if keepalive:
        return
    text = b"".join(client.chunks).decode()
    lines = [line for line in text.split("\n") if line]
    # What llmperf reads: every non-blank line an event's data (or its name), never a comment.
    assert lines and all(line.startswith(("data: ", "event: ")) for line in lines), lines
    assert "event: ping" not in text and text.count("event: response.in_progress") <= 1


_CHAT_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.mark.anyio
@pytest.mark.parametrize("path,body,marker,count", [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 2, "tools": _CHAT_TOOLS}, b": keep-alive\n\n", 1),
    # its opening (created, then in_progress) went out with the first token: a second in_progress is a keep-alive
    ("/v1/responses", {"input": "hi", "max_output_tokens": 16,
                       "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]},
     b"event: response.in_progress\n", 2),
    ("/v1/messages", {"model": "fake-model", "messages": USER, "max_tokens": 2,
                      "tools": [{"name": "f", "input_schema": {"type": "object"}}]}, b"event: ping\n", 1),
])
async def test_a_stream_quiet_after_its_first_token_gets_keep_alives(path: str, body: dict[str, Any], marker: bytes,
                                                                     count: int) -> None:
    # A tool call that comes whole (Qwen3-Coder's XML, Mistral) sent nothing after the first token: a proxy's 60 s
    # idle timer cut the stream. The n > 1 merged stream already sent them.
    engine = FakeEngine(pieces=["a", "b"])
    engine.gate = anyio.Event()  # the second token waits
    client = _Client({**body, "stream": True}, marker=marker, count=count)
    with anyio.fail_after(30):  # without keep-alives after the first token nothing comes: fail, do not hang
        async with anyio.create_task_group() as tg:
            tg.start_soon(_app(engine, 0.01, tg), asgi_scope(path), client.receive, client.send)
            await client.counted.wait()
            engine.gate.set()
            await client.leave.wait()
    text = b"".join(client.chunks).decode()
    assert text.index(marker.decode(), text.index("data: ")) < text.rindex("data: ")  # between the events
    if path == "/v1/responses":  # numbered in their place
        numbers = [e["sequence_number"] for e in named_events(text)]
        assert numbers == list(range(len(numbers)))
    assert engine.active == set()


@pytest.mark.anyio
async def test_a_client_leaving_a_kept_alive_stream_frees_its_row() -> None:
    # The stream's events are read by a task of the app's: the row must not outlive the client.
    engine = FakeEngine(pieces=["a", "b", "c"])
    engine.gate = anyio.Event()  # never set: the row waits for its second token until it is closed
    client = _Client({"messages": USER, "stream": True, "max_tokens": 3, "tools": _CHAT_TOOLS},
                     marker=b": keep-alive\n\n")
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_app(engine, 0.01, tg), asgi_scope("/v1/chat/completions"), client.receive, client.send)
            await client.counted.wait()
            client.leave.set()
    assert engine.active == set() and engine.closed_streams >= 1
    assert b"[DONE]" not in b"".join(client.chunks)


@pytest.mark.anyio
@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 2}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
])
async def test_a_reply_that_holds_nothing_back_is_read_directly(path: str, body: dict[str, Any]) -> None:
    # Reading the events through a task costs ~15 µs a token: a reply without tools sends each token as it comes,
    # so it is read directly and only its first token is awaited with keep-alives.
    engine = FakeEngine(pieces=["a", "b"])
    engine.gate = anyio.Event()  # the second token waits
    client = _Client({**body, "stream": True}, marker=b"data: ")
    watcher = FakeEngine(pieces=["a", "b"])
    watcher.first_gate = anyio.Event()
    clock = _Client({"messages": USER, "stream": True, "max_tokens": 2}, marker=b": keep-alive\n\n", count=3)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_app(engine, 0.01, tg), asgi_scope(path), client.receive, client.send)
            await client.counted.wait()
            # Another app's keep-alives at the same interval are the clock: three of them, and none here.
            tg.start_soon(_app(watcher, 0.01, tg), asgi_scope("/v1/chat/completions"), clock.receive, clock.send)
            await clock.counted.wait()
            assert b": keep-alive" not in b"".join(client.chunks)
            engine.gate.set()
            watcher.first_gate.set()
            await client.leave.wait()
            await clock.leave.wait()
    assert engine.active == set()


@pytest.mark.anyio
@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 2, "tools": _CHAT_TOOLS}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 16,
                       "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}),
    ("/v1/messages", {"model": "fake-model", "messages": USER, "max_tokens": 2,
                      "tools": [{"name": "f", "input_schema": {"type": "object"}}]}),
])
async def test_a_client_leaving_a_tool_reply_is_no_engine_failure(path: str, body: dict[str, Any],
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    # The reply read by a task (tools declared) saw its row end when the client left and logged "chat stream ...
    # failed: ... (the engine stopped)" each time gptme was stopped mid-answer: a false alarm for operators. Nor is a
    # call the client left in the middle of a block that "does not parse", nor a Responses reply cut so kept.
    from tests.service.chat.test_render import PLAIN, TemplateTokenizer

    engine = FakeEngine(pieces=['<tool_call>{"name": "f", "arguments": {"', 'x": 1}}</tool_call>'], context_length=4096)
    engine.tokenizer = TemplateTokenizer(PLAIN, markers=True)  # a model whose calls stream as <tool_call> blocks
    engine.gate = anyio.Event()  # the call's end waits until the client has gone
    client = _Client({**body, "stream": True}, marker=b"data: ")
    with anyio.fail_after(30), caplog.at_level("INFO"):
        async with anyio.create_task_group() as tg:
            app = _app(engine, 0.01, tg)
            tg.start_soon(app, asgi_scope(path), client.receive, client.send)
            await client.counted.wait()
            client.leave.set()
            while engine.active:  # the row is closed for the client that left
                await anyio.lowlevel.checkpoint()
            engine.gate.set()
    assert engine.closed_streams >= 1
    said = [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.levelname == "WARNING"] and not [m for m in said if "parse" in m], said
    if path == "/v1/responses":  # cut short by its client, it is not kept as a completed response
        kept = app.state[STATE_KEY].issued_items
        assert kept.stats()["entries"] == 0, kept.stats()


class _IsolatedRows(FakeEngine):
    """A FakeEngine whose rows are --isolate's (RemoteRowStream), which the test feeds as the relay thread would."""

    def __init__(self) -> None:
        super().__init__()
        from service.isolate.remote import RemoteEngine

        self.remote = RemoteEngine(ServiceConfig())  # never started: no engine process, only its rows' bookkeeping

    def submit(self, request: Any) -> Any:
        from service.isolate.remote import RemoteRowStream

        self.requests.append(request)
        row = RemoteRowStream(self.remote, len(self.requests))
        self.remote._streams[row.rid] = row
        return row


_DIED = "The engine process exited (status -9); it is restarting."


@pytest.mark.anyio
@pytest.mark.parametrize("path,body", STREAMED_ROUTES)
async def test_an_engine_process_dying_after_the_keep_alives_ends_the_stream_with_its_error_event(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, path: str, body: dict[str, Any]) -> None:
    # --isolate, the engine process killed while prompts waited in prefill: rows with no token yet get
    # EngineRestarting (a 503 before the headers), but these had sent their headers and keep-alives. They were cut
    # with no error event and no [DONE], the log saying only "Exception caught after response started".
    from service.chat import choices, respond

    monkeypatch.setattr(respond, "FIRST_BYTE_WAIT", 0.01)
    monkeypatch.setattr(choices, "FIRST_BYTE_WAIT", 0.01)
    engine = _IsolatedRows()
    client = _Client({**body, "stream": True}, marker=b"\n\n", count=2)  # two writes: headers and keep-alives are out
    with anyio.fail_after(30), caplog.at_level("WARNING"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_app(engine, 0.01, tg), asgi_scope(path), client.receive, client.send)
            await client.counted.wait()
            assert engine.remote._streams  # no row has its first token
            engine.remote._fail_streams(_DIED, restarting=True)
            await client.leave.wait()
    text = b"".join(client.chunks).decode()
    if path in ("/v1/responses", "/v1/messages"):
        last = named_events(text)[-1]
        assert last["type"] == "error" and last["error"]["message"] == _DIED, last
        if path == "/v1/responses":
            assert named_events(text)[-2]["type"] == "response.failed" and last["code"] == "engine_restarting"
    else:
        events = client.events()
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "engine_restarting", events
        assert events[-2]["error"]["message"] == _DIED
    assert [r for r in caplog.records if _DIED in r.getMessage()] and \
        len([r for r in caplog.records if r.levelname == "WARNING"]) == 1, caplog.records  # the root cause, once


@pytest.mark.anyio
async def test_an_unexpected_failure_after_the_keep_alives_is_a_500_event_and_logged_with_its_traceback(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from service.chat import respond

    monkeypatch.setattr(respond, "FIRST_BYTE_WAIT", 0.01)
    engine = _IsolatedRows()
    client = _Client({"messages": USER, "max_tokens": 2, "stream": True}, marker=b": keep-alive\n\n")
    with anyio.fail_after(30), caplog.at_level("WARNING"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_app(engine, 0.01, tg), asgi_scope("/v1/chat/completions"), client.receive, client.send)
            await client.counted.wait()
            engine.remote._streams[1].deliver(RuntimeError("the relay broke"))
            await client.leave.wait()
    events = client.events()
    assert events[-1] == "[DONE]" and events[-2]["error"]["type"] == "server_error", events
    logged = [r for r in caplog.records if "the relay broke" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None


# A stream failing after its headers: the engine's error on its third delta, or its deadline while it waits for its
# second (FakeEngine.gate never opened).
_FAILURES = [("engine", "server_error"), ("deadline", "request_timeout")]
_USAGE_ROUTES = [
    ("/v1/chat/completions", {"messages": USER}),
    ("/v1/chat/completions", {"messages": USER, "n": 2}),
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/completions", {"prompt": ["hi", "there"]}),
]


def _failing(failure: str) -> tuple[FakeEngine, ServiceConfig]:
    engine = FakeEngine()
    if failure == "engine":
        engine.fail_with, engine.fail_at = "the device fell over", 2
        return engine, ServiceConfig()
    engine.gate = anyio.Event()
    return engine, ServiceConfig(request_timeout=0.2)


@pytest.mark.parametrize("failure,code", _FAILURES)
@pytest.mark.parametrize("path,body", _USAGE_ROUTES)
@pytest.mark.parametrize("options", [{"include_usage": True},
                                     {"include_usage": True, "continuous_usage_stats": True}, None])
def test_a_stream_failing_after_its_headers_sends_the_usage_it_asked_for_before_the_error(
        failure: str, code: str, path: str, body: dict[str, Any], options: dict[str, Any] | None) -> None:
    # The usage chunk was left out: a client metering by stream_options.include_usage saw the tokens it was shown
    # billed nowhere, while /metrics counted them.
    engine, config = _failing(failure)
    with TestClient(create_app(AppState(engine=engine, config=config))) as client:
        response = client.post(path, json={**body, "stream": True, "max_tokens": 8,
                                           **({"stream_options": options} if options else {})})
    assert response.status_code == 200
    *chunks, usage, error, done = sse_events(response.text)
    assert done == "[DONE]" and error["error"]["code" if failure == "deadline" else "type"] == code, error
    if options is None:  # none asked for: none sent
        assert usage["choices"] and all("usage" not in c for c in (*chunks, usage))
        return
    assert usage["choices"] == [] and all(c["choices"] for c in chunks), usage
    counts = usage["usage"]
    prompts = [len(r.prompt_tokens) for r in engine.requests]
    assert counts["prompt_tokens"] == sum(sorted(set(prompts))) > 0  # each prompt once, as a whole stream's
    shown = sum(1 for c in chunks if (c["choices"][0].get("delta") or {}).get("content") or c["choices"][0].get("text"))
    assert counts["completion_tokens"] >= shown > 0
    assert counts["total_tokens"] == counts["prompt_tokens"] + counts["completion_tokens"]


@pytest.mark.anyio
@pytest.mark.parametrize("path,body", STREAMED_ROUTES)
async def test_a_stream_failing_after_the_keep_alives_sends_its_usage_first(
        monkeypatch: pytest.MonkeyPatch, path: str, body: dict[str, Any]) -> None:
    # Failed before its first token, after its headers: the prompt's usage, no completion tokens.
    from service.chat import choices, respond

    monkeypatch.setattr(respond, "FIRST_BYTE_WAIT", 0.01)
    monkeypatch.setattr(choices, "FIRST_BYTE_WAIT", 0.01)
    engine = _IsolatedRows()
    asks = "model" not in body and "input" not in body  # chat and completions ask; the others always carry usage
    client = _Client({**body, "stream": True, **({"stream_options": {"include_usage": True}} if asks else {})},
                     marker=b"\n\n", count=2)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_app(engine, 0.01, tg), asgi_scope(path), client.receive, client.send)
            await client.counted.wait()
            engine.remote._fail_streams(_DIED, restarting=True)
            await client.leave.wait()
    if path == "/v1/responses":  # response.failed carried no usage here (it did for a failure after a token)
        *_, failed, error = named_events(b"".join(client.chunks).decode())
        assert failed["type"] == "response.failed" and error["type"] == "error", failed
        usage = failed["response"]["usage"]
        assert usage["input_tokens"] > 0 and usage["output_tokens"] == 0, usage
        return
    if path == "/v1/messages":
        *_, delta, error = named_events(b"".join(client.chunks).decode())
        assert delta["type"] == "message_delta" and delta["delta"]["stop_reason"] is None, delta
        assert delta["usage"]["input_tokens"] > 0 and delta["usage"]["output_tokens"] == 0
        assert error["type"] == "error"
        return
    *_, usage, error, done = client.events()
    assert done == "[DONE]" and error["error"]["code"] == "engine_restarting"
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] > 0 and usage["usage"]["completion_tokens"] == 0
