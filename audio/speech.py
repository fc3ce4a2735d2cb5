"""SpeechService — the one object the service layer talks to for transcription and live sessions.

It owns the Whisper residency, the scheduler every window goes through (audio/scheduler.py), the live
sessions (each with a background pump), their caps and their idle expiry. Every model touch is a bounded
step on the shared driver loop; the caller only sees numpy and text.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncGenerator, Awaitable, Callable, Sequence, cast, get_args

import anyio
import numpy as np

from audio.buffers import AudioPool
from audio.decoding import _prompt_tokens
from audio.errors import InvalidOption, SessionLimit, SessionNotFound, SessionShareLimit, SpeechNotRunning
from audio.file_transcription import transcribe_stream
from audio.idle_release import IdleRelease
from audio.mel import HOP_LENGTH
from audio.pcm import SAMPLE_RATE
from audio.scheduler import Pace, StepBudget, WhisperScheduler
from audio.sessions import LiveConfig, LiveSession
from audio.speech_thread import speech_nice_default, speech_turns_default, step_thread_default
from audio.transcript import Segment, Task, TokenCounts, TranscribeOptions, Transcript, spoken_languages
from audio.warmup import compiles_kernels, warm_up_signal
from audio.whisper import (
    DEMO_ALIASES,
    DEMO_MODEL,
    WhisperResidency,
    default_dtype,
    prepare_whisper,
    resolve_whisper_checkpoint,
)
from audio.whisper_imports import import_name
from engine.context import EngineThread
from engine.memory import release_free_memory

if TYPE_CHECKING:
    from engine.tasks import ExecutionTasks

_log = logging.getLogger(__name__)

__all__ = ["SpeechService", "transcribe_stream"]


class SpeechService:
    """Transcription and live sessions over one Whisper checkpoint, on the engine's task queue.
    `run()` must be running (in the app's task group) for sessions and idle unloads to work."""

    def __init__(self, tasks: "ExecutionTasks", checkpoint: str | Path, *, name: str | None = None,
                 dtype: str | None = None, idle_unload_sec: float = 0.0, resident: bool = False,
                 session_ttl_sec: float = 300.0, max_sessions: int = 64, budget: StepBudget | None = None,
                 live: LiveConfig | None = None, max_buffered_sec: float | None = 1800.0,
                 pace: Pace | None = None, vad: bool = True, step_thread: bool | None = None,
                 turn: Callable[[], Awaitable[None]] | None = None, max_owner_sessions: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`pace`: seconds of a chat iteration while chat rows decode, else None (Engine.chat_pace): Whisper
        steps then take at most `budget.chat_share` of it. `vad`: the default of options() when a request
        does not say. `step_thread`: while `run()` runs, Whisper steps run on a thread of their own beside the chat
        steps (None: step_thread_default()). `turn`: returns once chat's next step has landed (Engine.chat_turn);
        with the step thread and speech_turns_default(), each Whisper step waits for it. `max_owner_sessions`:
        the most sessions one owner (an API key) may hold at once (None: no cap; sessions without an owner are
        never capped). `clock`: monotonic seconds for idleness (injectable for tests). Raises nothing."""
        self.step_thread = step_thread
        self.turn = turn
        self.vad_default = vad
        self.tasks = tasks
        self.residency = WhisperResidency(Path(checkpoint), tasks, dtype=dtype, name=name,
                                          idle_unload_sec=idle_unload_sec, resident=resident)
        self.scheduler = WhisperScheduler(tasks, budget, pace)
        self.live = live or LiveConfig()
        self.pool = AudioPool(max_buffered_sec)
        self.session_ttl_sec = session_ttl_sec
        self.max_sessions = max_sessions
        self.max_owner_sessions = max_owner_sessions
        self.clock = clock
        self.sessions: dict[str, LiveSession] = {}
        self.expired = 0
        self.idle_release = IdleRelease()
        self._tg: anyio.abc.TaskGroup | None = None

    @classmethod
    def from_spec(cls, tasks: "ExecutionTasks", spec: str | None, **kwargs: Any) -> "SpeechService":
        """Resolve a model name (dir, HF cache id, CTranslate2 dir, `tiny.en`) and build the service.
        Raises WhisperCheckpointError when it is not a Whisper checkpoint."""
        dtype = kwargs.get("dtype") or default_dtype()
        path = resolve_whisper_checkpoint(spec, dtype)
        if spec is None or spec in DEMO_ALIASES:
            name = f"whisper-{DEMO_MODEL}"
        elif (given := Path(spec).expanduser()).exists():
            # A CTranslate2 folder is served under its own name (the name its import goes by), not the import's
            # `<name>-<dtype>`: a request names the folder, and this machine's dtype is no part of the model.
            name = path.name if path.resolve() == given.resolve() else import_name(path, dtype)
        else:
            name = spec
        kwargs.setdefault("name", name)
        return cls(tasks, path, **kwargs)

    @property
    def model_name(self) -> str:
        return self.residency.name

    @functools.cached_property
    def _n_vocab(self) -> int | None:
        """From config.json, without loading weights. Raises nothing (unreadable → None)."""
        import json

        try:
            return int(json.loads((self.residency.path / "config.json").read_text())["n_vocab"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @property
    def multilingual(self) -> bool:
        """From config.json's vocabulary size, as mlx-whisper's Whisper.is_multilingual. Raises nothing (unreadable
        → True)."""
        return self._n_vocab is None or self._n_vocab >= 51865

    @property
    def num_languages(self) -> int | None:
        """How many of Whisper's languages the model has tokens for (mlx-whisper's Whisper.num_languages: 99, or
        100 from large-v3 on). Raises nothing (unreadable → None: not checked here)."""
        if self._n_vocab is None:
            return None
        return self._n_vocab - 51765 - int(self.multilingual)

    def token_counts(self, prompt: str | None, text: str, seconds: float) -> TokenCounts:
        """What transcribing `seconds` of audio into `text` with `prompt` costs in Whisper's tokens, counted as a
        file's decoding counts them (WindowedTranscription.token_counts): the prompt's tokens a window reads (its
        last 223 at most: every Whisper's n_text_ctx is 448), 50 encoder positions a second, the text's tokens. From
        the tokenizer alone (prepare_whisper built it; no weights needed). Raises nothing."""
        from mlx_whisper.tokenizer import get_tokenizer

        tok = get_tokenizer(self.multilingual, num_languages=self.num_languages or 99, language="en", task="transcribe")
        written = len(tok.encode(" " + text.strip(), disallowed_special=())) if text.strip() else 0
        return TokenCounts(prompt=min(len(_prompt_tokens(tok, prompt)), 448 // 2 - 1), output=written,
                           audio=-(-round(seconds * SAMPLE_RATE) // (HOP_LENGTH * 2)))

    def options(self, *, language: str | None = None, languages: Sequence[str] = (), task: str = "transcribe",
                english_only_transcribes: bool = False, **kwargs: Any) -> TranscribeOptions:
        """TranscribeOptions checked against this model; `vad` None (or absent) takes the service's default.
        `languages`: those the speech may be in (transcript.spoken_languages: one is the language, more restrict
        detection). `english_only_transcribes` (/v1/audio/translations): translate on an English-only model is
        served, as its transcription (as faster-whisper and openai-whisper run it: its tokenizer has no task token,
        and English is its one language), not refused. Raises InvalidOption naming `language`, `languages[N]`,
        `languages`, `task`, `prompt` or a vad setting (unknown language, a non-English language / translate on an
        English-only model, a prompt longer than Whisper can use: PromptTooLong, vad_trim with vad on)."""
        code, among = spoken_languages(language, languages, multilingual=self.multilingual,
                                       num_languages=self.num_languages)
        if kwargs.get("vad") is None:
            kwargs["vad"] = self.vad_default
        if kwargs.get("vad_trim") and kwargs["vad"]:  # accepted, it would change nothing: VAD keeps only speech
            raise InvalidOption("vad_trim cuts leading and trailing silence with vad off only; with vad on (this "
                                "server's default unless it runs with --no-vad) only the speech is decoded already",
                                param="vad_trim")
        if task not in get_args(Task):
            raise InvalidOption(f"unknown task {task!r}; use one of {', '.join(get_args(Task))}", param="task")
        if task == "translate" and not self.multilingual and not english_only_transcribes:
            raise InvalidOption("this Whisper model is English-only; task 'translate' is not available", param="task")
        return TranscribeOptions(language=code, languages=among, task=cast(Task, task), **kwargs)

    # ---- files -------------------------------------------------------------------------------
    def transcribe_stream(self, pcm: np.ndarray,
                          options: TranscribeOptions) -> AsyncGenerator[list[Segment] | Transcript, None]:
        """See module-level transcribe_stream. Raises as it does."""
        return transcribe_stream(pcm, options, self.residency, self.scheduler, self.tasks)

    async def transcribe(self, pcm: np.ndarray, options: TranscribeOptions) -> Transcript:
        """Whole signal → Transcript. Raises as transcribe_stream."""
        result: Transcript | None = None
        async for item in self.transcribe_stream(pcm, options):
            if isinstance(item, Transcript):
                result = item
        assert result is not None
        return result

    # ---- live sessions -----------------------------------------------------------------------
    def create_session(self, options: TranscribeOptions, *, expires: bool = True,
                       owner: str | None = None) -> LiveSession:
        """Open a session and start its pump. Never evicts a live session: idle-expired ones are reaped, then
        a full house refuses. `expires` False: never reaped for idleness (its owner deletes it). `owner`: the
        API key's id (max_owner_sessions caps each one). Raises SpeechNotRunning when run() is not running,
        SessionLimit when max_sessions are open, SessionShareLimit when `owner` holds max_owner_sessions;
        either with the seconds until one of the sessions in the way can expire by itself as `retry_after`."""
        if self._tg is None:
            raise SpeechNotRunning("SpeechService.run() is not running")
        now = self.clock()
        if len(self.sessions) >= self.max_sessions:
            self._expire(now)
        if len(self.sessions) >= self.max_sessions:
            self._reap_ended()
        if len(self.sessions) >= self.max_sessions:
            raise self._refusal(list(self.sessions.values()), now, SessionLimit,
                                f"too many open audio sessions ({self.max_sessions}, --max-sessions)")
        cap = self.max_owner_sessions
        if owner is not None and cap is not None:
            mine = [s for s in self.sessions.values() if s.owner == owner]
            if len(mine) >= cap:
                self._expire(now)
                mine = [s for s in mine if s.id in self.sessions]
            if len(mine) >= cap:
                raise self._refusal(mine, now, SessionShareLimit,
                                    f"this API key holds {len(mine)} of the {self.max_sessions} audio sessions, its "
                                    "share while other keys may need them (--key-session-share)")
        session = LiveSession(options, self.residency, self.scheduler, self.tasks, config=self.live, pool=self.pool,
                              expires=expires, owner=owner, clock=self.clock)
        self.sessions[session.id] = session
        self._tg.start_soon(session.pump, name=f"session {session.id}")
        return session

    def get_session(self, session_id: str) -> LiveSession:
        """Raises SessionNotFound (unknown, deleted or expired id)."""
        try:
            return self.sessions[session_id]
        except KeyError:
            raise SessionNotFound(f"no audio session {session_id!r} (unknown, deleted or expired)") from None

    def delete_session(self, session_id: str) -> None:
        """Cancel and forget a session; its queued windows never run. Raises SessionNotFound."""
        self.get_session(session_id).cancel()
        del self.sessions[session_id]

    def _reap_ended(self) -> None:
        # A full house makes room with the longest-idle closed session (finished: it takes no audio; a finish in
        # progress keeps its object) before it refuses a new one: "finish or delete one" said so.
        ended = [s for s in self.sessions.values() if s.expires and s.closed]
        if ended:
            oldest = min(ended, key=lambda s: s.last_active)
            self.sessions.pop(oldest.id, None)
            self.expired += 1

    def _expire(self, now: float) -> None:
        # Idle: its client sent nothing for the TTL and it has no work in hand (a client reading the text of
        # audio still being transcribed is not idle). Websocket sessions too: a silent socket held a place forever.
        ttl = self.session_ttl_sec
        stale = [s for s in self.sessions.values() if s.expires and now - s.last_active > ttl and not s.busy]
        for s in stale:
            s.expire(f"session {s.id} expired: its client sent nothing for {ttl:g} s (--session-ttl), so its place "
                     "was given up; open a new session to go on")
            self.sessions.pop(s.id, None)
            self.expired += 1

    def _refusal(self, blocking: list[LiveSession], now: float, kind: type[SessionLimit],
                 why: str) -> SessionLimit:
        """The refusal for a new session while `blocking` hold the places it needs: when the first of them can
        expire by itself (Retry-After), or that none can while they are in use. Raises nothing."""
        ttl = self.session_ttl_sec
        due = [s.last_active + ttl - now for s in blocking if s.expires and not s.busy]
        if due:
            wait = max(1, math.ceil(min(due)))
            return kind(f"{why}; the soonest one of them can free its place by itself is in {wait} s, if its client "
                        f"stays quiet (a session with nothing from its client for {ttl:g} s is dropped, "
                        "--session-ttl); one finished, deleted or closed frees a place sooner", retry_after=wait)
        # Each is transcribing (or never expires): none frees by itself before it has been quiet for the TTL.
        wait = max(1, math.ceil(ttl))
        return kind(f"{why}; every one is in use (its audio still being transcribed), so none can free its place by "
                    f"itself before {ttl:g} s from now (--session-ttl); one finished, deleted or closed frees a "
                    "place sooner", retry_after=wait)

    # ---- lifetime ----------------------------------------------------------------------------
    def stop(self) -> None:
        """The server shuts down and its grace period is over: Whisper work still in flight (files' windows, live
        sessions' decodes) ends now with SpeechStopped, later work is refused. Raises nothing."""
        self.scheduler.stop("The server is shutting down: the transcription was ended unfinished.")

    async def warm_up(self) -> float:
        """Each kind of Whisper step once, before clients come (why: audio/warmup.py): two files at once (stacked
        encoder units, batched decoder rows, a greedy and a sampled decode, language detection on a multilingual
        model) and a live session fed half a second at a time (its guesses and its final); then the scheduler's
        counters and measured step costs are reset (compiles are not serving costs). run() must be running.
        Returns the seconds taken. Raises WhisperCheckpointError, SpeechNotRunning, what a window raises."""
        t0 = time.perf_counter()
        signal = warm_up_signal(3.0)
        greedy = self.options(vad=False, temperatures=(0.0,))
        sampled = self.options(vad=False, temperatures=(0.6,), language=None if self.multilingual else "en")

        async def live() -> None:
            session = self.create_session(greedy, expires=False)
            try:
                for piece in np.array_split(signal, 6):
                    session.append_samples(piece)
                    await session.caught_up()
                await session.finish()
            finally:
                self.delete_session(session.id)

        await self.residency.take()  # loaded through the warm-up, whatever the idle policy
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.transcribe, signal[: len(signal) * 2 // 3], greedy)
                tg.start_soon(self.transcribe, signal, sampled)
                tg.start_soon(live)
        finally:
            self.residency.release()
        self.scheduler.forget_measurements()
        return time.perf_counter() - t0

    async def run(self, *, preload: bool = False, warm_up: bool | None = None, tick: float = 1.0,
                  task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Host session pumps; expire idle sessions and unload an idle model. Runs until cancelled. Before
        started(): prepare_whisper (imports, the tokenizer), `preload`, then `warm_up` (None: on a GPU only, where
        MLX compiles per kernel).
        Raises WhisperCheckpointError when `preload` fails, what warm_up() raises."""
        if _step_thread(self.step_thread):
            # A step's launch can cost the host as much as a chat iteration (H200: ~4.5 ms a turbo decoder
            # forward): on its own thread and MLX stream it no longer sits between two chat steps. Everything a
            # step builds stays on that thread.
            nice = speech_nice_default()
            self.scheduler.thread = EngineThread("tandem-speech", nice=nice)
            if nice > 0:  # niced beside chat only: alone, steps keep the process's priority (audio/scheduler.py)
                self.scheduler.alone_thread = EngineThread("tandem-speech-alone")
            self.scheduler.turn = self.turn if speech_turns_default() else None
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                try:
                    await anyio.to_thread.run_sync(prepare_whisper, self.residency.path)
                    if preload:  # stays loaded until the first take ends, then the idle policy applies
                        await self.residency.preload()
                    if warm_up or (warm_up is None and compiles_kernels()):
                        # Without `preload` too: the model is loaded for it, then the idle policy applies.
                        took = await self.warm_up()
                        _log.info("speech warm-up done in %.1f s (Whisper's kernels compiled)", took)
                    task_status.started()
                    while True:
                        await anyio.sleep(tick)
                        self._expire(self.clock())
                        now = time.monotonic()
                        self.residency.unload_if_due(now)
                        sch = self.scheduler
                        if self.idle_release.due(now, sch.in_flight, sch.counters.windows, sch.chat_active()):
                            await anyio.to_thread.run_sync(release_free_memory)
                finally:
                    self._tg = None
                    for s in list(self.sessions.values()):
                        s.cancel()
                    tg.cancel_scope.cancel()
        finally:
            threads = (self.scheduler.thread, self.scheduler.alone_thread)
            self.scheduler.thread = self.scheduler.alone_thread = None
            self.scheduler.turn = None
            for thread in threads:
                if thread is not None:
                    thread.close()

    def stats(self) -> dict[str, Any]:
        """Plain numbers for /stats. Raises nothing."""
        r = self.residency
        return {"model": r.name, "loaded": r.loaded is not None, "resident": r.resident,
                "idle_unload_sec": r.idle_unload_sec, "loads": r.loads, "unloads": r.unloads,
                "sessions_open": len(self.sessions), "max_sessions": self.max_sessions,
                "max_sessions_per_key": self.max_owner_sessions, "session_ttl_s": self.session_ttl_sec,
                "sessions_expired": self.expired, "idle_releases": self.idle_release.releases,
                "session_windows_done": sum(s.windows_done for s in self.sessions.values()),
                "session_lag_s_max": max((s.lag_seconds for s in self.sessions.values()), default=0.0),
                "buffered_audio_s": round(self.pool.total / SAMPLE_RATE, 3),
                "max_buffered_audio_s": None if self.pool.max_samples is None else self.pool.max_samples / SAMPLE_RATE,
                "max_session_s": self.live.max_session_s, "max_session_lag_s": self.live.max_lag_s,
                "vad_default": self.vad_default, "scheduler": self.scheduler.stats()}


def _step_thread(choice: bool | None) -> bool:
    return choice if choice is not None else step_thread_default()
