"""One live-transcription websocket: a LiveSession, the frames the client sends, the events it gets.

Two ways to talk, one session underneath:
- **Realtime** (OpenAI's transcription events, realtime_config.py and realtime_events.py): JSON client events
  `transcription_session.update` / `session.update`, `input_audio_buffer.append` (base64 PCM16 at the session's
  rate, 24 kHz unless declared, or G.711 at 8 kHz), `.commit`, `.clear`; server events driven by the session's own
  events.
  `/v1/realtime` always talks this way; `/v1/audio/live` does once one comes before any PCM frame or finish.
- **Binary frames** (simple clients of `/v1/audio/live`, frame_events.py): raw PCM frames in the query's format (or a
  piped WAV's, in its header's), or a browser's MediaRecorder stream (WebM / Ogg / fragmented MP4, its first frame
  carrying the header: socket_audio.py), text `{"type": "finish"}` to end; `transcript.partial` snapshots
  (committed + tentative text, at most one per `interval` s) and a final `transcript.done`.

Either way the socket is read until the client leaves — after a finish too, so keepalive pings are answered
and the transcript is delivered — and nothing a client sends ends the session: a bad frame (not JSON, not an
object, an unknown type, bad base64, an odd byte count, over the size limit, a refused option) gets an
`error` event and the audio received so far is kept. Audio refused by a cap (the session's backlog, all
sessions' buffer, the session's length) is an error event too, never a silent drop. When the socket closes
the session is cancelled: its queued Whisper work leaves before the next step. A server drain takes no more
audio (what the client sends meanwhile is dropped unanswered), sends the text of what came within the shutdown
timeout, a `conversation.item.input_audio_transcription.failed` for each committed item whose text did not come
then, one `error` (shutting_down) and close 1001.
A socket whose client sends nothing for the session TTL (--session-ttl) while none of its audio is being
transcribed gives its place up as an idle HTTP session does: an `error` (session_expired), then close 1000.

Replies go out in the order the client's events were handled: a reply (an error, `session.updated`) is queued
in the session's event log behind the events of the commits and clears before it (LiveSession.mark), and one
task writes that log, so `committed` and its item events (`conversation.item.created`, or a GA session's
`conversation.item.added` and `.done`) are never split.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from typing import Any

import anyio
from litestar import WebSocket

from audio.errors import AudioError, SessionExpired
from audio.pcm import PcmFormat
from audio.sessions import LiveSession
from audio.transcript import TranscribeOptions
from service.http.auth import client_key
from service.http.errors import APIError, api_error, error_body, error_event, event_id, frames_error_event
from service.http.guard import FRAME_REFUSED
from service.seams import SpeechBackend
from service.speech.client_events import (REALTIME_CLIENT_EVENTS, UNSUPPORTED_PREFIXES, Mode, decided_mode,
                                          decoded_event, frames_refusal)
from service.speech.frame_events import created_event, done_event, partial_event
from service.speech.live_audio import count_tails
from service.speech.realtime_config import Dialect, RealtimeConfig, field_paths
from service.speech.realtime_events import Items, server_events, transcription_failed
from service.speech.served import served_speech
from service.speech.socket_audio import SocketAudio
from service.speech.socket_errors import GONE, as_api_error, base64_audio, close_code, expiry, shutting_down, typed
from service.speech.transcription_fields import transcription_params, utterance_usage
from service.state import AppState

_log = logging.getLogger(__name__)

__all__ = ["LiveSocket", "Mode", "REALTIME_CLIENT_EVENTS"]


# Replies a client may have owed to it before its next message is read.
_MAX_OWED = 256


class _ClientGone(Exception):
    """The socket cannot be written any more."""


class LiveSocket:
    """Serves one accepted websocket until the client leaves (run())."""

    def __init__(self, socket: WebSocket[Any, Any, Any], state: AppState, speech: SpeechBackend, *,
                 config: RealtimeConfig, mode: Mode, dialect: Dialect, frame_format: PcmFormat,
                 interval: float = 0.0) -> None:
        self.socket, self.state, self.speech = socket, state, speech
        self.config, self.mode, self.dialect = config, mode, dialect
        self.frame_format, self.interval = frame_format, interval
        self.items = Items()
        self.audio = SocketAudio(state)
        self.session: LiveSession | None = None
        self._send_lock = anyio.Lock()
        self._sent = anyio.Event()  # set (and replaced) as each owed reply goes out
        self._partial_due = anyio.Event()
        self._finishing = False
        self._closed = False
        self._event_id: str | None = None  # the client event being handled (errors name it)
        self._replies: dict[str, dict[str, Any]] = {}  # replies waiting for their mark in the session's log
        self._reply_ids = itertools.count()
        self._writer_done = False  # the log's writer has ended: replies go out directly
        self._written = anyio.Event()  # set once the writer ended, every reply owed before then sent
        self._stopping = False  # the server drains: nothing more is taken
        self._ended = anyio.Event()  # the socket was closed (by us)
        self._took_audio = False  # the message being handled gave the session audio

    # ---- lifetime -----------------------------------------------------------------------------
    async def run(self) -> None:
        """Open the session, then read frames and write events until the client leaves. Raises nothing
        the client can cause."""
        try:
            # Reaped once idle for the session TTL, as HTTP sessions are: every client message and every decode
            # counts as activity, so only a client that sends nothing while nothing is being transcribed is idle.
            self.session = self.speech.create_session(self._options(self.config), owner=client_key(self.socket))
        except Exception as exc:
            err = as_api_error(exc)
            await self._send_error(err)
            await self._close(close_code(err))
            return
        count_tails(self.state, self.session)  # a container stream's tail comes with no frame: counted there
        try:
            await self._send(created_event(self.config, self.mode == "realtime", self.dialect, self.session.id,
                                           self.speech.model_name, self.frame_format))
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._write_events, tg.cancel_scope)
                tg.start_soon(self._partials)
                tg.start_soon(self._on_drain, tg, self.session)
                try:
                    await self._read(tg)
                finally:
                    tg.cancel_scope.cancel()
        except* _ClientGone:  # raised by whichever task wrote last; the task group wraps it
            pass
        finally:
            # Method calls, so they also reach a session served by reference (--isolate), which is gone with
            # its engine process when that died.
            with contextlib.suppress(*GONE):
                self.speech.delete_session(self.session.id)
            with contextlib.suppress(*GONE):
                self.session.cancel()

    def _usage(self, text: str, seconds: float) -> dict[str, Any]:
        """A transcript's usage as OpenAI's for the session's model (tokens or seconds). Raises as token_counts."""
        return utterance_usage(self.speech, self.config.model, self.config.full_prompt, text, seconds)

    def _options(self, config: RealtimeConfig) -> TranscribeOptions:
        return self.speech.options(**config.decoding(), temperatures=TranscribeOptions.ladder(0.0))

    # ---- reading -------------------------------------------------------------------------------
    async def _read(self, tg: anyio.abc.TaskGroup) -> None:
        while True:
            # A client that sends events without reading the replies: stop reading it (its sends wait in its own
            # buffers) rather than queue replies without bound.
            while len(self._replies) >= _MAX_OWED and not self._closed:
                await self._sent.wait()
            message = await self.socket.receive()
            if message.get("type") == "websocket.disconnect":
                return
            data, text = message.get("bytes"), message.get("text")
            self._event_id = None
            self._took_audio = False
            try:
                if isinstance(refused := message.get(FRAME_REFUSED), APIError):  # over the guard's limit, dropped
                    raise refused
                if self._stopping:  # dropped: the one shutting_down error before the close says why
                    continue
                if isinstance(data, bytes):
                    await self._frame(data)
                elif isinstance(text, str):
                    await self._text(text, tg)
            except _ClientGone:
                raise
            except Exception as exc:
                await self._send_error(as_api_error(exc))
            if not self._took_audio:  # audio taken restarted the session's idle clock already
                self._touch()

    def _touch(self) -> None:
        """The client sent a message: its session is not idle. Raises nothing."""
        assert self.session is not None
        with contextlib.suppress(*GONE):  # --isolate: gone with its engine process
            self.session.touch()

    async def _frame(self, data: bytes) -> None:
        if self.mode == "undecided":
            self.mode = "frames"
        assert self.session is not None
        await self.audio.frame(self.session, data, self.frame_format if self.mode == "frames" else
                               self.config.pcm_format)
        self._took_audio = True

    async def _text(self, text: str, tg: anyio.abc.TaskGroup) -> None:
        """Handle one text message. Raises APIError, ConfigError or an audio error for what cannot be done
        (the session goes on)."""
        event = decoded_event(text, self.state.config.limits.max_json_depth)
        kind = event.get("type")
        self._event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
        self.mode = decided_mode(self.mode, kind)
        if self.mode != "realtime":
            if kind == "finish":
                self._finish(tg)
                return
            raise frames_refusal(kind, self.mode)
        assert self.session is not None
        if kind in ("session.update", "transcription_session.update"):
            await self._reply(self._update(kind, event.get("session")))
        elif kind == "input_audio_buffer.append":
            self.audio.pcm(self.session, base64_audio(event.get("audio")), self.config.pcm_format)
            self._took_audio = True
        elif kind == "input_audio_buffer.commit":
            self.session.commit(self._event_id)
        elif kind == "input_audio_buffer.clear":
            self.session.clear()
        elif isinstance(kind, str) and kind.startswith(UNSUPPORTED_PREFIXES):
            raise APIError(400, f"{kind!r} is not available in a transcription session", param="type",
                           code="unsupported_event")
        else:
            raise APIError(400, f"unknown event type {kind!r}", param="type", code="unknown_event")

    def _update(self, kind: str, session: Any) -> dict[str, Any]:
        """Apply an update; returns the updated event. Raises ConfigError, APIError naming the field."""
        assert self.session is not None
        dialect: Dialect = "beta" if kind == "transcription_session.update" else "ga"
        new = self.config.updated(session, dialect)
        where, vad_where = field_paths(session, dialect)
        if new.model is not None:
            served_speech(self.state, new.model, param=f"{where}.model")
        if new.decoding() != self.config.decoding():
            # Mid-session too (LiveKit's update_options, Pipecat's settings): the session applies it from here on
            # (audio/sessions.py reconfigure), to the utterances that begin after it.
            params = transcription_params(where, len(new.languages))
            try:
                self.session.reconfigure(self._options(new))
            except AudioError as exc:
                changed = [k for k, v in new.decoding().items() if self.config.decoding().get(k) != v]
                field = changed[0] if changed else "session"
                refusal = api_error(exc, params=params)
                if refusal.param is None:
                    refusal.param = params.get(field, vad_where if field.startswith("vad") else "session")
                raise refusal from None
        self.config = new
        reply = "transcription_session.updated" if dialect == "beta" else "session.updated"
        return {"type": reply, "session": new.session_object(dialect, self.session.id, self.speech.model_name)}

    def _finish(self, tg: anyio.abc.TaskGroup) -> None:
        if self._finishing:
            raise APIError(400, "the session is already finishing", code="session_closed")
        self._finishing = True
        tg.start_soon(self._finish_frames)

    async def _finish_frames(self) -> None:
        """Binary-frame mode: the final transcript, then a normal close (the reader still answers pings)."""
        assert self.session is not None
        try:
            t = await self.session.finish()
        except Exception as exc:  # sent before the close, not queued behind it (draining: cancelled past the timeout)
            await self._written.wait()  # the errors owed for the frames before it go first
            await self._send_error(shutting_down() if self._stopping else as_api_error(exc), reply=False)
            await self._close(1001 if self._stopping else 1011)
            return
        await self._written.wait()  # the log is over: the errors owed for the frames before it go out first
        self._partial_due.set()
        await self._send(done_event(self.session, t))
        if self._stopping:
            await self._send_error(shutting_down(), reply=False)
        await self._close(1001 if self._stopping else 1000)

    async def _on_drain(self, tg: anyio.abc.TaskGroup, session: LiveSession) -> None:
        """On a drain: finish the session within the shutdown timeout; the writer or _finish_frames then closes."""
        await self.state.inflight.wait_stopping()
        self._stopping = True
        with anyio.move_on_after(self.state.config.shutdown_timeout) as grace, contextlib.suppress(Exception):
            await session.finish()  # a failure reaches the writer as session.error
        if grace.cancelled_caught:
            with contextlib.suppress(*GONE):  # --isolate: gone with its engine process
                session.cancel()
        if self.mode != "realtime" and not self._finishing:
            self._finish(tg)
        await self._ended.wait()
        tg.cancel_scope.cancel()

    # ---- writing -------------------------------------------------------------------------------
    async def _write_events(self, scope: anyio.CancelScope) -> None:
        try:
            await self._write_log(scope)
        finally:
            self._written.set()

    async def _write_log(self, scope: anyio.CancelScope) -> None:
        session = self.session
        assert session is not None
        try:
            async for ev in session.events():
                if ev.type == "mark":
                    if (reply := self._replies.pop(ev.ref or "", None)) is not None:
                        await self._send(reply)
                        self._reply_sent()
                elif self.mode == "realtime":
                    for out in server_events(ev, self.items, self.config.tentative, lambda: session.lag_seconds,
                                             self.config.logprobs, self.config.model, ga=self.dialect == "ga",
                                             usage=self._usage):
                        await self._send(out)
                elif ev.type in ("committed", "tentative"):
                    self._partial_due.set()
        except GONE as exc:  # --isolate: the engine process, and the session in it, died or was shut down
            await self._flush_replies()  # their marks will not come: owed all the same, before the close
            if self._stopping:  # a graceful stop, not a crash: as without --isolate
                await self._end(shutting_down(), 1001)
            else:
                err = api_error(exc)
                await self._end(err, close_code(err))  # 1013: a new session works once the engine is back
            return
        await self._flush_replies()
        if self._stopping and self.mode == "realtime":  # the server drains: the transcript above was the last
            await self._end(shutting_down(), 1001)
        elif (why := expiry(session)) is not None:
            # Idle for the session TTL, its place given up: the client is told why and the socket closes
            # normally; the reader stops too (a client that never answers the close holds nothing).
            await self._end(api_error(SessionExpired(why)), 1000)
            scope.cancel()
        elif session.error is not None and self.mode == "realtime":
            await self._end(api_error(session.error) if typed(session.error) else
                            APIError(500, f"transcription failed: {session.error}", type="server_error"), 1011)

    async def _flush_replies(self) -> None:
        """The log is over: what is owed goes out now, in order (a reply meanwhile too). Raises _ClientGone."""
        while self._replies:
            await self._send(self._replies.pop(next(iter(self._replies))))
            self._reply_sent()
        self._writer_done = True

    async def _end(self, err: APIError, code: int) -> None:
        """End the socket with `err`: first each committed item whose transcript will not come gets its `failed`
        event (OpenAI's, naming the item), then the error, then the close. Raises _ClientGone."""
        if self.mode == "realtime":
            for failed in transcription_failed(self.items, error_body(err)["error"]):
                await self._send(failed)
        await self._send_error(err, reply=False)
        await self._close(code)

    async def _partials(self) -> None:
        """Binary-frame mode: a snapshot of the text after each change, at most one per `interval` s."""
        while True:
            await self._partial_due.wait()
            self._partial_due = anyio.Event()
            session = self.session
            if self.mode != "frames" or session is None:
                continue
            committed = session.committed_text()  # read before the guess, which follows it
            await self._send(partial_event(session, committed, await session.tentative()))
            if self.interval > 0:
                await anyio.sleep(self.interval)  # pacing of snapshots, not synchronisation

    async def _send(self, event: dict[str, Any]) -> None:
        if self._closed:
            raise _ClientGone()
        event.setdefault("event_id", event_id())
        timeout = self.state.config.limits.send_timeout
        async with self._send_lock:
            try:
                # A client that reads nothing is cut off, as a stream's is (--send-timeout): its events were queued.
                with anyio.fail_after(timeout) if timeout else contextlib.nullcontext():
                    await self.socket.send_json(event)
            except TimeoutError:
                self._closed = True
                _log.info("live socket closed: its client read nothing for %g s (--send-timeout)", timeout)
                raise _ClientGone() from None
            except Exception:
                self._closed = True
                raise _ClientGone() from None

    def _reply_sent(self) -> None:
        """An owed reply went out: a reader held back by them may go on. Raises nothing."""
        self._sent.set()
        self._sent = anyio.Event()

    async def _reply(self, event: dict[str, Any]) -> None:
        """Send `event`, a reply to the client event being handled, after the session's events for the client
        events before it (their commits and clears are still being carried out). Raises _ClientGone."""
        session = self.session
        if session is None or self._writer_done:
            await self._send(event)
            return
        key = f"reply_{next(self._reply_ids)}"
        self._replies[key] = event
        try:
            session.mark(key)
        except Exception:  # --isolate: the session may be gone with its engine process; nothing to wait for
            if self._replies.pop(key, None) is not None:
                await self._send(event)

    async def _send_error(self, err: APIError, reply: bool = True) -> None:
        """`reply`: the error answers the client event being handled (it names its event_id) and keeps its place
        among the replies; otherwise it is the writer's own and goes out at once."""
        event = error_event(err, self._event_id if reply else None) if self.mode == "realtime" else \
            frames_error_event(err)
        await (self._reply(event) if reply else self._send(event))

    async def _close(self, code: int) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):  # the client left first
            await self.socket.close(code=code)
        self._ended.set()
