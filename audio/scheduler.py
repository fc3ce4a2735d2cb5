"""WhisperScheduler — Whisper windows in flight, advanced one bounded step per ExecutionTask.

A window's life: encoder units (audio/encoder.py), then one decoding row (audio/decoder.py) per temperature
of the fallback ladder, re-decoded at the next temperature while the thresholds ask for it. A step is either
an encoder step (units of the oldest window, each stacked with every window at the same unit) or a decoder
step (packed forwards of the rows); the kinds alternate while both have work. Exactly one step is queued at
a time, so the driver runs it between two LLM iterations and a chat stream waits for at most one step per
iteration (or, with `thread` set: by default, audio/speech.py, on a thread of its own beside them). Windows: window.py.

How long a step may run: while chat rows decode (the `pace` callable gives a chat iteration's seconds), at
most `chat_share` of a chat iteration (doubled for each `catch_up_seconds` the oldest live session's window
has waited, up to 8×, so live speech that falls behind catches up) — units and forwards are sized from their
measured costs (audio/pacing.py), prompts are fed in chunks, and at least one unit or one forward of one row
runs so speech always moves. Otherwise the full budget: `encoder_positions` per chunked unit, steps as long as one
such unit, and `decode_tokens` forwards of every row.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import anyio
import anyio.lowlevel

from audio.decoder import advance_rows, step_rows
from audio.encoder import CHUNKED, EncoderJob, run_unit
from audio.errors import SpeechStopped
from audio.handoff import hand_over
from audio.pcm import SAMPLE_RATE
from audio.mel import log_mel
from audio.pacing import Pace, StepBudget, StepClock, StepCosts, size_forward, size_unit
from audio.step_records import StepCounters, StepRecord, step_summary
from audio.window import Window, WindowRequest, WindowResult, unfed
from engine.blas_threads import follow_speech, recheck
from engine.context import EngineThread

if TYPE_CHECKING:
    from audio.whisper import LoadedWhisper
    from engine.tasks import ExecutionTasks

__all__ = ["StepBudget", "WhisperScheduler", "Pace", "StepRecord"]

_log = logging.getLogger(__name__)


class WhisperScheduler:
    """Windows from every session and file request, advanced together. `decode` is the only entry point;
    whoever awaits a window drives the steps while no one else does. An encoder step runs units of the
    oldest window (every other step: of the least advanced one), each stacked with every window at the same
    unit, until `encoder_positions` are spent."""

    def __init__(self, tasks: "ExecutionTasks", budget: StepBudget | None = None, pace: Pace | None = None) -> None:
        self.tasks = tasks
        self.budget = budget or StepBudget()
        self.clock = StepClock(self.budget, pace)
        self.costs = StepCosts()
        self.counters = StepCounters()
        self._rotation = 0
        self._windows: list[Window] = []
        self._seq = itertools.count()
        self._leading = False
        self._progress = anyio.Event()
        self._mels_pending = 0  # windows whose log-mel a worker thread is computing
        self._mel_done = anyio.Event()
        self._last_kind = ""
        # Where steps run: None, as tasks on the engine thread between LLM iterations; or a thread of their own
        # (SpeechService.run; by default), beside the chat steps instead of between them.
        self.thread: EngineThread | None = None
        # With `thread` niced (a CPU's default), steps run here while chat has no row: a niced thread yields to every
        # program, not only chat, and cannot take its priority back unprivileged (audio/handoff.py moves the windows).
        self.alone_thread: EngineThread | None = None
        self._stepped_on: EngineThread | None = None  # the thread of the last step (its windows' arrays are its)
        # With a thread of their own: awaited before each step, it returns once chat's next step has landed (at
        # once while chat has no row), so steps take turns with chat's instead of running back to back beside
        # them (opt-in: speech_turns_default in audio/speech.py says what it costs).
        self.turn: Callable[[], Awaitable[None]] | None = None
        self._stopped: str | None = None  # why every window ends now (stop(): the server shuts down)

    @property
    def in_flight(self) -> int:
        """Windows waiting for or in steps. Raises nothing."""
        return sum(1 for w in self._windows if w.live)

    async def decode(self, loaded: "LoadedWhisper", request: WindowRequest,
                     cancellation: anyio.CancelScope | None = None) -> WindowResult:
        """Decode one window among all others in flight. Cancelled (the caller, or the `cancellation` scope
        at once): the window leaves before the next step (a step already running finishes first). Raises
        what the window's steps raise (MLX errors, ValueError for options mlx-whisper refuses), TaskRejected
        at shutdown, SpeechStopped after stop()."""
        began = time.perf_counter()
        self._check_stopped()
        chunk = min(self.budget.encoder_positions, loaded.model.dims.n_audio_ctx)  # the full-budget unit
        # The log-mel is host work (tens of ms): on a worker thread it no longer holds the engine thread.
        self._mels_pending += 1
        try:
            mel = await anyio.to_thread.run_sync(log_mel, request.audio, loaded.model.dims.n_mels, request.frames,
                                                 request.mel_ceiling)
        finally:
            self._mels_pending -= 1
            self._mel_done.set()
            self._mel_done = anyio.Event()
        self._check_stopped()
        full = int(loaded.model.dims.n_audio_ctx)
        n_ctx = request.audio_ctx if request.audio_ctx is not None and 0 < request.audio_ctx < full else None
        job = EncoderJob(request.audio, request.frames, chunk, loaded.fp16, mel, n_ctx=n_ctx)
        keep = n_ctx is not None and request.redo_whole  # the whole window's redo needs the log-mel
        window = Window(loaded, request, job, next(self._seq), scope=cancellation, mel=mel if keep else None)
        self._windows.append(window)
        follow_speech(True)  # OpenBLAS keeps a core while chat runs beside Whisper or another process is busy
        try:
            waited = False
            while not window.finished:
                if self._leading:
                    await self._progress.wait()
                elif self._mels_pending and not waited:  # windows arriving together start together (units
                    waited = True                         # stack); once per step, so arrivals never starve it
                    await self._mel_done.wait()
                else:
                    waited = False
                    await self._lead()
        except BaseException:
            window.cancelled = True
            raise
        finally:
            self._forget(window)
        if window.error is not None:
            raise window.error
        assert window.result is not None
        if _log.isEnabledFor(logging.DEBUG):  # each window's shape, time and text (`tandem serve --log-level debug`)
            _log.debug("window: %.2f s of audio, %d temperature(s), prompt %d + prefix %d tokens, context %s: %.3f s, "
                       "%r", len(request.audio) / SAMPLE_RATE, len(request.temperatures), len(request.prompt),
                       len(request.prefix), request.audio_ctx or "whole", time.perf_counter() - began,
                       window.result.decoded.text)
        return window.result

    def stop(self, why: str) -> None:
        """End every window in flight with SpeechStopped(`why`) and refuse later ones: the server shuts down and
        a file's or a session's windows would otherwise run on past the shutdown timeout. Their callers raise it
        at once (a leader after its running step). Raises nothing."""
        self._stopped = why
        for w in list(self._windows):
            if not w.finished:
                w.error = SpeechStopped(why)
        self._progress.set()  # the waiters see their windows ended
        self._progress = anyio.Event()

    def _check_stopped(self) -> None:
        if self._stopped is not None:
            raise SpeechStopped(self._stopped)

    def chat_active(self) -> bool:
        """Whether chat has rows now: speech then shares the machine with it. Raises nothing."""
        return self.clock.chat_pace() is not None

    def step_thread(self) -> EngineThread | None:
        """The thread the next step runs on: `alone_thread` while chat has no row (no pace), else `thread`."""
        return self.alone_thread if self.alone_thread is not None and not self.chat_active() else self.thread

    async def _lead(self) -> None:
        recheck()  # no chat iteration samples the machine's load while speech alone runs (engine/blas_threads.py)
        self._leading = True
        if (thread := self.step_thread()) is not None:
            try:
                if self.turn is not None:
                    await self.turn()
                if await hand_over(self._stepped_on, thread, list(self._windows)):
                    self.counters.handoffs += 1
                self._stepped_on = thread
                await thread.run(self._step)  # shielded: a cancelled caller waits for its step to end
            finally:
                self._leading = False
                self._progress.set()
                self._progress = anyio.Event()
            # The step's wait was shielded: a caller cancelled meanwhile (a live probe dropped) learns it here, or
            # its window, no longer live, would lead empty steps forever.
            await anyio.lowlevel.checkpoint_if_cancelled()
            return
        scope = anyio.CancelScope()
        handle = self.tasks.enqueue(self._step, cancellation=scope, label="whisper.step")
        try:
            await handle.done.wait()
        except BaseException:
            if handle.started:
                with anyio.CancelScope(shield=True):
                    await handle.done.wait()
            else:
                scope.cancel()  # dropped at the driver's next prune; another waiter leads
            raise
        finally:
            self._leading = False
            self._progress.set()
            self._progress = anyio.Event()
        handle.result()  # TaskRejected at shutdown; step errors are recorded per window

    def _forget(self, window: Window) -> None:
        try:
            self._windows.remove(window)
        except ValueError:
            pass
        if not self._windows:
            follow_speech(False)

    # ---- one step (engine thread) ---------------------------------------------------------
    def _plan(self) -> None:
        # Only live sessions' windows catch up: a file's transcript has no deadline that chat should pay for.
        self.clock.plan(w.since for w in list(self._windows) if w.live and w.request.realtime)

    def _step(self) -> str:
        self._plan()
        live = [w for w in list(self._windows) if w.live]
        encoding = [w for w in live if not w.encoder.done]
        decoding = [w for w in live if w.row is not None]
        if encoding and decoding:
            kind = "decode" if self._last_kind == "encode" else "encode"
        else:
            kind = "encode" if encoding else "decode" if decoding else "idle"
        limit, paced = self.clock.limit, self.clock.paced
        t0 = time.perf_counter()
        work = 0
        if kind == "encode":
            work = self._encode(encoding, limit, paced, t0)
        elif kind == "decode":
            work = self._decode(decoding, limit, t0)
        self._last_kind = kind
        seconds = time.perf_counter() - t0
        c = self.counters
        c.paced_steps += paced and kind != "idle"
        c.encode_s += seconds if kind == "encode" else 0.0
        c.decode_s += seconds if kind == "decode" else 0.0
        c.kinds = (c.kinds + [kind])[-256:]
        c.steps = (c.steps + [StepRecord(kind, limit, len(decoding), work, seconds)])[-256:]
        return kind

    def _encode(self, pending: list[Window], limit: float | None, paced: bool, t0: float) -> int:
        """Full budget: encoder_positions // chunk window-units (at least one), each unit of every kind
        counting one. Paced: units sized to the limit (at least one). Returns the work done."""
        self.counters.encoder_steps += 1
        full = max(1, self.budget.encoder_positions // pending[0].encoder.chunk)  # window-units of the full budget
        units = None if paced else full
        work = 0
        ran = False
        # Where a step may run several window-units (a GPU's minimum step, a large budget), every other step the
        # least advanced windows go: they catch up with the oldest, so their units stack and their rows decode
        # together. Where it runs one (a CPU), live windows never caught up: the encoder was shared among every
        # window in flight (16 CPU speakers: 10-16 at once, each ~6 s). There the oldest goes first while it is a
        # live session's; a file's windows have no deadline and still overlap (their rows then decode together).
        catch_up = full > 1 or self.clock.min_step() > 0 or not pending[0].request.realtime
        while pending and (units is None or units > 0):
            head = pending[0] if self.counters.encoder_steps % 2 or not catch_up \
                else min(pending, key=lambda w: w.encoder.progress)
            group = [w for w in pending if w.encoder.unit == head.encoder.unit and w.loaded is head.loaded
                     and w.encoder.n_ctx == head.encoder.n_ctx]
            kind, model = head.encoder.kind, head.loaded.model
            positions: int | None = None  # the window's chunk
            if units is not None:
                group = group[:units]
                units -= len(group)
                if units <= 0 and time.perf_counter() - t0 < self.clock.encode_for(self._last_kind):
                    units = full  # another round
            else:
                left = None if limit is None else limit - (time.perf_counter() - t0)
                plan = size_unit(self.costs[kind], group, kind in CHUNKED, head.encoder.left(model), left, ran)
                if plan is None:
                    break
                group, positions = list(plan[0]), plan[1]
            t = time.perf_counter()
            try:
                run_unit(model, [w.encoder for w in group], positions)
            except Exception as exc:
                for w in group:
                    w.error = exc
            chunked = kind in CHUNKED
            size = len(group) * (min(positions or head.encoder.chunk, head.encoder.context(model)) if chunked else 1)
            self.costs[kind].record(size, time.perf_counter() - t)
            work += size
            ran = True
            for w in group:
                if w.encoder.done and w.error is None:
                    self._guarded(w, Window.start_decoding)
            pending = [w for w in pending if not w.encoder.done and w.error is None]
        return work

    def _decode(self, windows: list[Window], limit: float | None, t0: float) -> int:
        """Full budget (`limit` None): decode_tokens forwards of every row, prompts fed whole. Paced: forwards
        of the rows in turn (a rotating start), prompts fed in chunks, until the limit would pass. Returns
        the tokens fed."""
        self.counters.decoder_steps += 1
        if limit is None:
            picked = windows[: self.budget.max_rows]
            self.counters.max_rows = max(self.counters.max_rows, len(picked))
            while picked:
                for group in self._by_model(picked):
                    try:
                        advance_rows(group[0].loaded.model, [w.row for w in group if w.row is not None],
                                     self.budget.decode_tokens)
                    except Exception as exc:  # the rows of this forward fail; the others go on
                        for w in group:
                            w.error = exc
                self._finish_rows(picked)
                if time.perf_counter() - t0 >= self.clock.min_step():
                    break
                picked = [w for w in picked if w.row is not None and not w.row.done and w.error is None]
            self.clock.last_decode_s = time.perf_counter() - t0
            return 0
        fed = 0
        ran = False
        while True:
            live = [w for w in windows if w.row is not None and not w.row.done and w.error is None]
            if not live:
                break
            start = self._rotation % len(live)
            ordered = live[start:] + live[:start]
            ordered = [w for w in ordered if w.loaded is ordered[0].loaded][: self.budget.max_rows]
            plan = size_forward(self.costs["forward"], ordered, unfed, limit - (time.perf_counter() - t0), ran)
            if plan is None:
                break
            group, feed = plan
            self._rotation += len(group)
            self.counters.max_rows = max(self.counters.max_rows, len(group))
            t = time.perf_counter()
            try:
                forward = step_rows(group[0].loaded.model, [w.row for w in group if w.row is not None], feed,
                                    company=[w.row for w in ordered if w.row is not None])
            except Exception as exc:
                for w in group:
                    w.error = exc
                break
            self.costs["forward" if forward.logits else "prefill"].record(forward.tokens, time.perf_counter() - t)
            fed += forward.tokens
            ran = True
            self._finish_rows(group)
        return fed

    @staticmethod
    def _by_model(windows: list[Window]) -> list[list[Window]]:
        # Rows of different model objects (a reload) never share a forward.
        groups: dict[int, list[Window]] = {}
        for w in windows:
            groups.setdefault(id(w.loaded.model), []).append(w)
        return list(groups.values())

    def _finish_rows(self, windows: list[Window]) -> None:
        for w in windows:
            if w.row is not None and w.row.done and w.error is None:
                self._guarded(w, self._finish)

    @staticmethod
    def _guarded(w: Window, fn: Any) -> None:
        try:
            fn(w)
        except Exception as exc:  # this window fails; the step goes on
            w.error = exc

    def _finish(self, w: Window) -> None:
        outcome = w.finish_row()
        if outcome == "redo":
            self.counters.whole_window_redos += 1
        elif outcome == "fallback":
            self.counters.fallbacks += 1
        else:
            self.counters.windows += 1

    def forget_measurements(self) -> None:
        """Zero the counters and drop the measured step costs: a warm-up's compiles are not serving costs, and
        paced steps are sized from these costs. Event loop, with no window in flight. Raises nothing."""
        self.costs = StepCosts()
        self.counters = StepCounters()

    def stats(self) -> dict[str, Any]:
        """Plain numbers for /stats. Raises nothing."""
        c = self.counters
        return {"windows_in_flight": self.in_flight, "windows_done": c.windows, "encoder_steps": c.encoder_steps,
                "decoder_steps": c.decoder_steps, "encode_s": round(c.encode_s, 3), "decode_s": round(c.decode_s, 3),
                "fallbacks": c.fallbacks,
                "whole_window_redos": c.whole_window_redos, "max_rows_per_step": c.max_rows, "handoffs": c.handoffs,
                "paced_steps": c.paced_steps, "encoder_positions_per_step": self.budget.encoder_positions,
                "decode_tokens_per_step": self.budget.decode_tokens, "chat_share": self.budget.chat_share,
                "catch_up_s": self.budget.catch_up_seconds,
                **self.clock.stats(), "costs": self.costs.stats(),
                "recent_steps": step_summary(c.steps), "own_thread": self.thread is not None,
                "alone_thread": self.alone_thread is not None}
