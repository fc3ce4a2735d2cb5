"""The engine process of `--isolate`: loads the model, runs the engine's loop, and answers the API process.

Started by service/isolate/remote.py as `python -m service.isolate.host` with the serve config and the
supervisor's address in its environment. It dies with its parent (PR_SET_PDEATHSIG on Linux, a parent-pid watch
elsewhere, and the end of the connection everywhere), so an API process killed with -9 leaves no engine holding the
GPU. It ignores SIGINT and SIGTERM: a terminal's Ctrl-C and systemd's stop (KillMode=control-group) reach every
process of the group, and the engine must outlive the API process's drain; it stops when told (Shutdown) or when
the connection ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
from multiprocessing.connection import Client, Connection
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel

from service.isolate.messages import (
    ADDRESS_ENV,
    AUTHKEY_ENV,
    Cancel,
    RefuseQueued,
    Deltas,
    ErrorInfo,
    Failed,
    Ready,
    Rejected,
    Shutdown,
    Snapshot,
    Submit,
)
from engine.load_stop import LOADS
from service.isolate.objects import Call, ObjectServer
from service.process.gc_pauses import GC_PAUSES, ready_for_serving
from service.process.parent import exit_with_parent

__all__ = ["main", "SNAPSHOT_SECONDS"]

SNAPSHOT_SECONDS = 0.5
_log = logging.getLogger("tandem.isolate")


def main() -> int:
    """Entry point of the engine process. Returns the exit code."""
    _ignore_stop_signals()  # first: a Ctrl-C during the imports or the load would kill it too
    parent = os.getppid()
    from engine.backend import ensure_fast_blas

    ensure_fast_blas()  # before mlx is imported, as in every entry point
    exit_with_parent(parent)
    from service.config import ServiceConfig
    from service.logs import configure_logging

    config = ServiceConfig.from_env()
    configure_logging(config.log_level, config.log_format)
    conn = Client(os.environ[ADDRESS_ENV], authkey=bytes.fromhex(os.environ[AUTHKEY_ENV]))
    try:
        anyio.run(_host, conn, config)
    finally:
        conn.close()
    return 0


def _ignore_stop_signals() -> None:
    """Leave SIGINT and SIGTERM to the API process: sent to the process group (Ctrl-C, systemd), they killed this
    one at once, so its streams ended as a crash and the supervisor started a new engine while stopping."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def _by_reference(value: Any) -> bool:
    # Speech objects with state (the service, live sessions, the model residency) stay here; plain
    # results (transcripts, options, events: dataclasses) travel by value.
    return type(value).__module__.startswith("audio.") and not dataclasses.is_dataclass(value)


async def _host(conn: Connection, config: Any) -> None:
    from audio.errors import SessionNotFound
    from engine.errors import EngineError
    from service.engines import open_engine, open_tasks_engine
    from service.speech.setup import speech_config, speech_lifespan
    from service.state import AppState

    send_inbox, inbox = anyio.create_memory_object_stream[object](1 << 16)
    token = anyio.lowlevel.current_token()
    stopping = threading.Event()  # told to stop (Shutdown), or the API process is gone

    def read() -> None:  # a thread: the connection blocks
        while True:
            try:
                message: object = conn.recv()
            except Exception:  # EOF; or this process closed the connection under the read (it is ending)
                message = Shutdown()
            if isinstance(message, Shutdown):
                stopping.set()
                LOADS.set()  # a load in progress gives up (a first start's conversion, at its next tensor)
            try:
                anyio.from_thread.run_sync(send_inbox.send_nowait, message, token=token)
            except Exception:  # the loop is gone
                return
            if isinstance(message, Shutdown):
                return

    # Read from the start: the API process may stop while the model loads (its messages wait in the inbox).
    threading.Thread(target=read, name="tandem-isolate-read", daemon=True).start()
    speech_options = speech_config(config)
    try:
        open_ = open_tasks_engine if speech_options is not None and speech_options.transcription_only else open_engine
        engine = await open_(config)
    except Exception as exc:  # reported to the API process, which says why and stops
        conn.send(Failed(ErrorInfo.of(exc)))
        return
    if stopping.is_set():  # the API process stopped while the model loaded: nobody waits for it
        engine.close()
        return
    objects = ObjectServer(conn.send, _by_reference,
                           gone=lambda: SessionNotFound("The engine process restarted: this session is gone."))
    outbox = _Outbox(conn)
    streams: dict[int, Any] = {}

    async def forward(rid: int, stream: Any) -> None:
        try:
            async for delta in stream:
                outbox.add(rid, delta)
        finally:
            streams.pop(rid, None)

    async def snapshots() -> None:
        while True:
            conn.send(Snapshot({**engine.stats(), "gc_engine_process": GC_PAUSES.snapshot()}, engine.health()))
            await anyio.sleep(SNAPSHOT_SECONDS)

    async with anyio.create_task_group() as tg, contextlib.AsyncExitStack() as speech:
        tg.start_soon(engine.serve)
        warm_up = getattr(engine, "warm_up", None)
        if warm_up is not None and config.warmup is not False:
            await warm_up(lambda line: _log.info("%s", line), force=config.warmup)
        ref, aliases = None, []
        if speech_options is not None:  # the speech hook, as in-process, on this process's engine
            state = AppState(config=config, engine=engine)
            await speech.enter_async_context(speech_lifespan(state))
            ref, aliases = objects.register(state.speech), sorted(state.speech_aliases)
        conn.send(Ready(engine.model_name, engine.context_length, engine.vocab_size, _tokenizer_dir(engine),
                        list(engine.plan.reasons) if engine.plan is not None else [], os.getpid(), ref, aliases,
                        engine.sampling_defaults, engine.model_root, engine.max_model_len))
        ready_for_serving(config.freeze_gc, config.gc_thresholds)
        tg.start_soon(snapshots)
        async for message in inbox:
            if isinstance(message, Submit):
                try:
                    streams[message.rid] = stream = engine.submit(message.request)
                except EngineError as exc:
                    conn.send(Rejected(message.rid, ErrorInfo.of(exc)))
                    continue
                tg.start_soon(forward, message.rid, stream)
            elif isinstance(message, Cancel):
                if (stream := streams.pop(message.rid, None)) is not None:
                    stream.cancel()
            elif isinstance(message, RefuseQueued):
                engine.refuse_queued()
            elif isinstance(message, Call):
                tg.start_soon(objects.handle, message)
            elif isinstance(message, Shutdown):
                break
        engine.close()
        tg.cancel_scope.cancel()


def _tokenizer_dir(engine: Any) -> str | None:
    loaded = getattr(engine, "loaded", None)
    directory = getattr(loaded, "directory", None)
    return str(directory) if directory is not None else None


class _Outbox:
    """Deltas gathered while the loop publishes one iteration, sent as one message when it next turns.

    The engine publishes every row's delta in one synchronous pass; each row's forwarder then runs once.
    The flush is scheduled by the first forwarder, so it runs after the others: one message per iteration."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.items: list[tuple[int, Any]] = []

    def add(self, rid: int, delta: Any) -> None:
        if not self.items:
            import asyncio

            asyncio.get_running_loop().call_soon(self.flush)
        self.items.append((rid, delta))

    def flush(self) -> None:
        items, self.items = self.items, []
        if items:
            self.conn.send(Deltas(items))


if __name__ == "__main__":
    raise SystemExit(main())
