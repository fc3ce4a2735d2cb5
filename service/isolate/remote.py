"""RemoteEngine — the ChatEngine of the API process under `--isolate`: the engine and its model run in a
child process (service/isolate/host.py) that this object starts, feeds and restarts.

The API process keeps HTTP, chat templating and SSE; the engine process keeps MLX, so the two never
share a GIL. Requests go over one local connection; each engine iteration's deltas come back as one
message for all rows. When the engine process dies (kill -9, out of memory), every stream in flight ends
with an error event, new requests get 503 with Retry-After while a new engine process loads the model,
and /health says "restarting" until it is ready.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import subprocess
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from engine.contracts import Delta, FinishReason, GenerationRequest, GrammarSpec
from engine.errors import EngineClosed, EngineRestarting
from engine.tasks import ExecutionTasks
from service.config import ServiceConfig
from service.isolate.launch import accept, receive_ready, spawn, wait_exit
from service.isolate.objects import ObjectClient, Ref, RemoteObject
from service.process.restarts import RestartPolicy
from service.isolate.messages import Cancel, RefuseQueued, Deltas, Rejected, Shutdown, Snapshot, Submit

__all__ = ["RemoteEngine", "RemoteRowStream", "open_isolated_engine"]

_log = logging.getLogger("tandem.isolate")

RESTART_RETRY_AFTER = 10  # seconds a client is told to wait while the engine process reloads the model
# No snapshot for this long (they come every 0.5 s) and the engine process is stopped or hung: /health says so.
SILENT_SECONDS = 15.0


class RemoteRowStream:
    """One row's deltas as they arrive from the engine process; closing it cancels the row there."""

    def __init__(self, engine: "RemoteEngine", rid: int) -> None:
        self._engine = engine
        self.rid = rid
        self._send: MemoryObjectSendStream[Delta | BaseException]
        self._receive: MemoryObjectReceiveStream[Delta | BaseException]
        self._send, self._receive = anyio.create_memory_object_stream[Delta | BaseException](1 << 20)
        self.ended = False
        self.started = False  # a delta came: the client may have seen part of the answer

    def deliver(self, item: Delta | BaseException) -> None:
        """Event loop: one delta (or the error the engine refused the row with). Raises nothing."""
        try:
            self._send.send_nowait(item)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.WouldBlock):
            return
        self.started = True
        if isinstance(item, BaseException) or item.finish_reason is not None:
            self.ended = True
            self._send.close()

    def __aiter__(self) -> "RemoteRowStream":
        return self

    async def __anext__(self) -> Delta:
        try:
            return self._unwrap(await self._receive.receive())
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    def receive_nowait(self) -> Delta:
        """The next delta if one is waiting. Raises anyio.WouldBlock / anyio.EndOfStream."""
        return self._unwrap(self._receive.receive_nowait())

    @staticmethod
    def _unwrap(item: Delta | BaseException) -> Delta:
        if isinstance(item, BaseException):
            raise item
        return item

    async def aclose(self) -> None:
        """Cancel the row in the engine process (if still running). Raises nothing."""
        self.cancel()

    def cancel(self) -> None:
        """Synchronous cancel. Raises nothing."""
        if not self.ended:
            self.ended = True
            self._engine._cancel(self.rid)
        self._receive.close()


class _Plan:
    def __init__(self, reasons: list[str]) -> None:
        self.reasons = reasons


class RemoteEngine:
    """ChatEngine whose model runs in a supervised child process (see module doc)."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.tasks = ExecutionTasks()  # nothing runs here: the engine process owns the loop
        self.tokenizer: Any = None
        self.model_name: str | None = None
        self.model_root: str | None = None
        self.context_length: int | None = None
        self.max_model_len: int | None = None
        self.vocab_size: int | None = None
        self.sampling_defaults: dict[str, float] = {}
        self.plan: _Plan | None = None
        self.pid: int | None = None
        self.restarts = 0
        self._state = "starting"
        self._closed = False
        self._refusing = False  # shutting down: submit refuses (refuse_queued)
        self._rids = itertools.count(1)
        self._streams: dict[int, RemoteRowStream] = {}
        self._conn: Connection | None = None
        # False from the moment the relay thread sees the connection end (before the event loop learns it):
        # requests then get 503 at once instead of going to a process that is gone.
        self._connected = False
        self._process: subprocess.Popen[bytes] | None = None
        self._snapshot: Snapshot = Snapshot({}, {"ok": True})
        self._heard = time.monotonic()  # when the engine process last sent a snapshot (or became ready)
        self._exited = anyio.Event()
        self._policy = RestartPolicy()
        self._failure = ""
        # The engine process's objects used by reference (its SpeechService), and the current one's root.
        self.objects = ObjectClient(self._send, ready=self._ready)
        self.speech_ref: Ref | None = None
        self.speech_aliases: list[str] = []
        self._speech: tuple[Ref, RemoteObject] | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the engine process and wait until its model is loaded. Raises RuntimeError when the
        engine process cannot start or load its model (with its reason)."""
        listener, self._process = spawn(self.config)
        conn = await anyio.to_thread.run_sync(accept, listener, self._process)
        ready = await anyio.to_thread.run_sync(receive_ready, conn)
        self._conn, self._connected = conn, True
        self.objects.reopen()
        self.model_name, self.context_length, self.vocab_size = ready.model_name, ready.context_length, ready.vocab_size
        self.sampling_defaults, self.model_root = dict(ready.sampling_defaults), ready.model_root
        self.max_model_len = ready.max_model_len
        self.plan, self.pid = _Plan(list(ready.plan_reasons)), ready.pid
        self.speech_ref, self.speech_aliases = ready.speech, list(ready.speech_aliases)
        if self.tokenizer is None and ready.tokenizer_dir:
            from engine.models import load_tokenizer

            self.tokenizer = await anyio.to_thread.run_sync(load_tokenizer, ready.tokenizer_dir)
        self._heard = time.monotonic()
        self._state = "ready"

    async def serve(self) -> None:
        """Relay the engine process's messages until `close()`; restart it when it dies. Raises nothing
        but cancellation."""
        while not self._closed:
            if self._conn is None:
                await self._restart()
                continue
            conn, process = self._conn, self._process
            self._exited = anyio.Event()
            loop = asyncio.get_running_loop()
            threading.Thread(target=self._read, args=(conn, loop), name="tandem-isolate-relay", daemon=True).start()
            await self._exited.wait()
            code = await anyio.to_thread.run_sync(wait_exit, process)
            self._conn = None
            if self._closed:
                break
            if self._refusing:  # the drain began: a new engine would load only to be stopped
                self._state, self._failure = "stopped", f"The engine process exited (status {code}) while stopping."
                _log.warning("%s", self._failure)
                self._fail_streams(self._failure)
                break
            decision = self._policy.decide(code, time.monotonic())
            if not decision.respawn:  # a crash loop: stop, and say so on /health
                self._state, self._failure = "failed", f"The engine process stopped: {decision.reason}."
                _log.error("%s", self._failure)
                self._fail_streams(self._failure)
                break
            _log.warning("engine process: %s; restarting", decision.reason)
            self._fail_streams(f"The engine process exited (status {code}); it is restarting.", restarting=True)
            self.restarts += 1
            self._state = "restarting"
            await anyio.sleep(decision.delay)

    def close(self) -> None:
        """Stop: rows end, the engine process exits (killed if it does not within seconds). Raises nothing."""
        if self._closed:
            return
        self._closed = True
        self._state = "stopped"
        if self._conn is not None:
            try:
                self._conn.send(Shutdown())
            except OSError:
                pass
        if self._process is not None:
            threading.Thread(target=wait_exit, args=(self._process, 20.0), daemon=True).start()
        self._exited.set()
        self._fail_streams("The server is shutting down.", reason="cancelled")
        # Speech calls in flight (a file, a live session's events) end as shut down; the relay, seeing the
        # connection end next, must not report a crash (engine_restarting, close 1013) to them.
        self.objects.fail_all("The server is shutting down.", kind="SpeechStopped")

    def refuse_queued(self) -> int:
        """Shutting down: the engine process ends its queued rows (their streams get "cancelled") and refuses
        new ones; so does this side, and an engine process that exits from now on is not restarted. Returns 0: the
        count is the engine process's. Raises nothing."""
        self._refusing = True
        self._send(RefuseQueued())
        return 0

    # -- ChatEngine -------------------------------------------------------------------------------

    def prepare_grammar(self, spec: GrammarSpec) -> None:
        """Nothing here: the engine process builds the matchers as the request arrives there (on its own loop: a
        schema whose lexer takes seconds holds that process's streams meanwhile). Raises nothing."""

    def submit(self, request: GenerationRequest) -> RemoteRowStream:
        """Send the request to the engine process; refusals arrive as the stream's first item (the typed
        engine error). Raises EngineRestarting while the engine process (re)starts, EngineClosed after
        close()."""
        if self._closed or self._refusing:
            raise EngineClosed("engine is shutting down")
        if self._state == "failed":
            raise EngineClosed(self._failure)
        if not self._ready():
            raise EngineRestarting("The engine process is restarting; try again shortly.",
                                   retry_after=RESTART_RETRY_AFTER)
        stream = RemoteRowStream(self, next(self._rids))
        self._streams[stream.rid] = stream
        self._send(Submit(stream.rid, request))
        return stream

    def speech(self) -> RemoteObject | None:
        """The engine process's SpeechService, used by reference; None when it serves no speech. Raises nothing."""
        ref = self.speech_ref
        if ref is None:
            return None
        if self._speech is None or self._speech[0] is not ref:  # one proxy per engine process: it is never released
            self._speech = (ref, self.objects.proxy(ref))
        return self._speech[1]

    def stats(self) -> dict[str, Any]:
        """The engine process's last stats (at most SNAPSHOT_SECONDS old) plus the supervisor's. Raises nothing."""
        return {**self._snapshot.stats,
                "isolate": {"state": self._state, "pid": self.pid, "restarts": self.restarts}}

    def chat_pace(self) -> float | None:
        """None: speech does not run beside an isolated engine. Raises nothing."""
        return None

    def _ready(self) -> bool:
        return self._state == "ready" and self._conn is not None and self._connected

    def health(self) -> dict[str, Any]:
        """Restarting while the engine process loads; otherwise what the engine process says. Raises nothing."""
        if self._state == "failed":
            return {"ok": False, "error": self._failure}
        if not self._ready():
            return {"ok": False, "status": "restarting", "error": "the engine process is starting",
                    "retry_after": RESTART_RETRY_AFTER}
        # Its snapshots come every SNAPSHOT_SECONDS: silence means a stopped or hung process, which no exit reports.
        if (silent := time.monotonic() - self._heard) > SILENT_SECONDS:
            return {"ok": False, "error": f"the engine process (pid {self.pid}) has not answered for {silent:.0f} s"}
        return self._snapshot.health

    # -- the connection ---------------------------------------------------------------------------

    async def _restart(self) -> None:
        self._state = "restarting"
        self.pid = None  # the dead process's pid is nobody's now; the new one's comes with its Ready
        started = time.monotonic()
        try:
            await self.start()
        except Exception:
            _log.exception("engine process restart failed")
            await anyio.sleep(max(0.0, 5.0 - (time.monotonic() - started)))  # do not spin on a model that fails

    def _read(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        """Relay thread: every message onto the event loop, in order; the end of the connection too."""
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                self._connected = False
                if self._refusing and not self._closed:  # stopping: no new engine process comes
                    self.objects.fail_all("The server is shutting down.", kind="SpeechStopped")
                elif not self._closed:  # closed: close() ended the calls as shut down already
                    self.objects.fail_all("The engine process exited; it is restarting.")
                loop.call_soon_threadsafe(self._exited.set)
                return
            if not self.objects.deliver(message, lambda fn: loop.call_soon_threadsafe(fn)):
                loop.call_soon_threadsafe(self._dispatch, message)

    def _dispatch(self, message: object) -> None:
        if isinstance(message, Deltas):
            for rid, delta in message.items:
                stream = self._streams.get(rid)
                if stream is not None:
                    stream.deliver(delta)
                    if stream.ended:
                        del self._streams[rid]
        elif isinstance(message, Rejected):
            if (stream := self._streams.pop(message.rid, None)) is not None:
                stream.deliver(message.error.exception())
        elif isinstance(message, Snapshot):
            self._snapshot, self._heard = message, time.monotonic()

    def _send(self, message: object) -> None:
        try:
            if self._conn is not None:
                self._conn.send(message)
        except OSError:  # the engine process is gone: the relay notices and restarts it
            pass

    def _cancel(self, rid: int) -> None:
        if self._streams.pop(rid, None) is not None:
            self._send(Cancel(rid))

    def _fail_streams(self, message: str, reason: FinishReason = "error", restarting: bool = False) -> None:
        """End every row. `restarting`: a row that produced nothing yet gets EngineRestarting (a 503 with
        Retry-After: nothing was answered, the client may send it again; a stream whose headers and keep-alives went
        out ends with its error event: service/chat/respond.py); the others end with the error."""
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            if restarting and not stream.started:
                stream.deliver(EngineRestarting(message, retry_after=RESTART_RETRY_AFTER))
            else:
                stream.deliver(Delta(finish_reason=reason, error=message if reason == "error" else None))


async def open_isolated_engine(config: ServiceConfig) -> RemoteEngine:
    """Start the engine process for `config` and wait for its model. Raises RuntimeError (with the engine
    process's reason) when it cannot start."""
    engine = RemoteEngine(config)
    await engine.start()
    return engine
