"""The engine process of `--isolate`: loads the model, runs the engine's loop, and answers the API process.

Started by service/isolate/remote.py as `python -m service.isolate.host` with the serve config and the
supervisor's address in its environment. It dies with its parent (PR_SET_PDEATHSIG on Linux, and the end
of the connection everywhere), so an API process killed with -9 leaves no engine holding the GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import signal
import sys
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
from service.isolate.objects import Call, ObjectServer
from service.process.gc_pauses import GC_PAUSES, ready_for_serving

__all__ = ["main", "SNAPSHOT_SECONDS"]

SNAPSHOT_SECONDS = 0.5
_log = logging.getLogger("tandem.isolate")


def main() -> int:
    """Entry point of the engine process. Returns the exit code."""
    from engine.backend import ensure_fast_blas

    ensure_fast_blas()  # before mlx is imported, as in every entry point
    _die_with_parent()
    from service.config import ServiceConfig
    from service.logs import configure_logging

    config = ServiceConfig.from_env()
    configure_logging(config.log_level)
    conn = Client(os.environ[ADDRESS_ENV], authkey=bytes.fromhex(os.environ[AUTHKEY_ENV]))
    try:
        anyio.run(_host, conn, config)
    finally:
        conn.close()
    return 0


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


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

    speech_options = speech_config(config)
    try:
        open_ = open_tasks_engine if speech_options is not None and speech_options.transcription_only else open_engine
        engine = await open_(config)
    except Exception as exc:  # reported to the API process, which says why and stops
        conn.send(Failed(ErrorInfo.of(exc)))
        return
    objects = ObjectServer(conn.send, _by_reference,
                           gone=lambda: SessionNotFound("The engine process restarted: this session is gone."))
    send_inbox, inbox = anyio.create_memory_object_stream[object](1 << 16)
    token = anyio.lowlevel.current_token()
    outbox = _Outbox(conn)
    streams: dict[int, Any] = {}

    def read() -> None:  # a thread: the connection blocks
        while True:
            try:
                message: object = conn.recv()
            except (EOFError, OSError):
                message = Shutdown()
            try:
                anyio.from_thread.run_sync(send_inbox.send_nowait, message, token=token)
            except Exception:  # the loop is gone
                return
            if isinstance(message, Shutdown):
                return

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
                        engine.sampling_defaults, engine.model_root))
        ready_for_serving(config.freeze_gc, config.gc_thresholds)
        threading.Thread(target=read, name="tandem-isolate-read", daemon=True).start()
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
