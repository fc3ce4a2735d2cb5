"""Graceful stop of a worker on SIGTERM/SIGINT: stop admission, let what is in flight finish within the
shutdown timeout, end what is left with its final events, then let granian stop the worker.

Admission stops at once (`state.draining`: new requests get 503 with Retry-After, /health says
"stopping"), and requests queued in the engine but not yet running are refused then too (503 shutting_down,
where the engine offers `refuse_queued`). Live websockets are told at once (`InFlight.stop`): each takes no
more audio, sends the transcript of what it received, an error event (shutting_down) and closes with 1001
(service/speech/live_socket.py). After `shutdown_timeout` the speech service is stopped and the engine closed:
every running generation and transcription ends, and each stream sends an error event (code shutting_down) and
`[DONE]`, each file request a 503 shutting_down, before the worker goes. A second interrupt (the supervisor's
HURRY_SIGNAL) ends that wait at once: what is in flight gets the same final events now, not at the deadline.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import anyio

from engine.load_stop import LOADS

if TYPE_CHECKING:
    from service.state import AppState

__all__ = ["install_drain", "drain", "HURRY_SIGNAL"]

_log = logging.getLogger("tandem.service")

# After the engine closed, how long the last streams get to write their final events.
_FINAL_EVENTS_SECONDS = 5.0
_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# What the supervisor sends a worker on a second interrupt (service/process/supervisor.py): end what is in flight
# now, with its final events, instead of waiting out the shutdown timeout. (A worker not yet listening for it dies
# of it, as a forced stop means.)
HURRY_SIGNAL = signal.SIGUSR1


async def drain(state: "AppState", hurry: anyio.Event | None = None) -> None:
    """Stop admission, wait up to shutdown_timeout for requests in flight (less once `hurry` is set: a second
    interrupt), then close the engine so the rest end with their final events, and wait briefly for them. Raises
    nothing."""
    state.draining = True
    _refuse_queued(state)
    state.inflight.stop()  # live sockets never end by themselves: they wind up within the timeout below
    timeout = state.config.shutdown_timeout
    if not state.ready and state.inflight.count == 0:  # nothing served yet: the load gives up (install_drain)
        _log.info("stopping before the models were loaded")
        return
    _log.info("stopping: %d requests in flight get %g s to finish", state.inflight.count, timeout)
    with anyio.move_on_after(timeout):
        await _idle_or_hurried(state, hurry)
    if state.inflight.count > 0:
        _log.info("stopping: ending %d requests still in flight", state.inflight.count)
        _stop_speech(state)  # before the engine: under --isolate the speech service is reached through it
        if state.engine is not None:
            state.engine.close()
        with anyio.move_on_after(_FINAL_EVENTS_SECONDS):
            await state.inflight.wait_idle()


async def _idle_or_hurried(state: "AppState", hurry: anyio.Event | None) -> None:
    """Return once nothing is in flight, or `hurry` is set. Raises nothing."""
    if hurry is None:
        await state.inflight.wait_idle()
        return
    async with anyio.create_task_group() as tg:
        async def first(wait: Callable[[], Awaitable[Any]]) -> None:
            await wait()
            tg.cancel_scope.cancel()

        tg.start_soon(first, state.inflight.wait_idle)
        tg.start_soon(first, hurry.wait)


def _stop_speech(state: "AppState") -> None:
    """End the Whisper work still in flight (files' windows, sessions' decodes): the engine's close does not reach
    it, and a long file ran on until granian killed the worker. Raises nothing."""
    if state.speech is None:
        return
    try:
        state.speech.stop()
    except Exception:  # the drain must go on (--isolate: the engine process may be gone)
        _log.warning("stopping: could not stop the speech service", exc_info=True)


def _refuse_queued(state: "AppState") -> None:
    """End the generations still queued (not yet running) now, each with finish_reason "cancelled" (503
    shutting_down): they would only wait out the grace period to get that answer. Running ones keep it. Raises
    nothing."""
    if state.engine is None:
        return
    try:
        refused = state.engine.refuse_queued()
    except Exception:  # the drain must go on; the close after the timeout still ends them
        _log.warning("stopping: could not refuse the queued requests", exc_info=True)
        return
    if refused:
        _log.info("stopping: refused %d queued requests", refused)


def install_drain(state: "AppState") -> bool:
    """Take over SIGTERM and SIGINT on the running asyncio loop: the first one stops the loads in progress
    (engine/load_stop.py) and drains (see `drain`), then hands the signal to the handler it replaced (granian's,
    which stops the worker); later ones are ignored while draining (a terminal's Ctrl-C reaches the worker and the
    supervisor both). HURRY_SIGNAL, the supervisor's word for a second interrupt, ends the drain's wait at once (or
    drains at once, when it comes first). Call it on the loop granian runs the app on. Returns False when the loop's
    handlers cannot be taken over. Raises nothing."""
    loop = asyncio.get_running_loop()
    previous: dict[int, Callable[[], Any]] = {}
    for sig in _SIGNALS:
        # asyncio keeps each handler as a Handle in `_signal_handlers` (private, stable since 3.4).
        handle = getattr(loop, "_signal_handlers", {}).get(sig)
        if handle is not None:
            previous[sig] = handle._run
    started: list[asyncio.Task[None]] = []
    hurry = anyio.Event()

    async def drain_then_forward(sig: int) -> None:
        await drain(state, hurry)
        forward = previous.get(sig) or previous.get(signal.SIGTERM)
        if forward is not None:
            forward()
        else:  # no handler to hand over to: stop the way an unhandled signal would
            for each in _SIGNALS:
                loop.remove_signal_handler(each)
            signal.raise_signal(signal.SIGTERM)

    def on_signal(sig: int) -> None:
        # A signal callback runs outside any task: the drain gets its own (kept referenced in `started`).
        if sig == HURRY_SIGNAL:
            hurry.set()
        if not started:
            LOADS.set()  # a model still loading gives up (a first start's conversion at its next tensor)
            started.append(loop.create_task(drain_then_forward(sig)))

    try:
        for sig in (*_SIGNALS, HURRY_SIGNAL):
            loop.add_signal_handler(sig, on_signal, sig)
    except (NotImplementedError, RuntimeError, ValueError):
        return False
    return True
