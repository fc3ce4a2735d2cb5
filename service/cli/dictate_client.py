"""The client half of `tandem dictate`: a Realtime transcription session over a websocket (the same events
OpenAI clients use), fed from a file at a given speed or from takes of a microphone, and a terminal display
where committed text is printed once and the tentative guess after it is rewritten in place."""

from __future__ import annotations

import base64
import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import anyio
import numpy as np

__all__ = ["LiveLine", "DictateSession", "realtime_url", "pcm16_chunks", "FINAL_COMMIT"]

FINAL_COMMIT = "dictate_take_end"  # the event_id of the commit that ends a take


def realtime_url(server: str) -> str:
    """`http://host:port[/v1]` → `ws://host:port/v1/realtime?intent=transcription`. Raises ValueError for a
    URL that is not http(s) or ws(s)."""
    base = server.rstrip("/")
    for http, ws in (("https://", "wss://"), ("http://", "ws://")):
        if base.startswith(http):
            base = ws + base[len(http):]
    if not base.startswith(("ws://", "wss://")):
        raise ValueError(f"not a server URL: {server!r} (use e.g. http://127.0.0.1:8080)")
    if not base.endswith("/v1"):
        base += "/v1"
    return f"{base}/realtime?intent=transcription"


def pcm16_chunks(pcm: np.ndarray, rate: int, chunk_ms: int) -> list[bytes]:
    """Float samples → 16-bit little-endian chunks of `chunk_ms`. Raises nothing."""
    step = max(1, rate * chunk_ms // 1000)
    data = (np.clip(pcm, -1.0, 1.0) * 32767).astype("<i2")
    return [data[i:i + step].tobytes() for i in range(0, len(data), step)]


class LiveLine:
    """Committed text written once; the tentative guess after it rewritten in place (a terminal) or left
    out (a pipe, where only committed text and line ends are written)."""

    def __init__(self, out: TextIO, tty: bool | None = None, width: int | None = None) -> None:
        self.out = out
        self.tty = out.isatty() if tty is None else tty
        self.width = width or shutil.get_terminal_size((100, 20)).columns
        self.line = ""  # committed text on the current terminal line
        self.tentative = ""
        self.text: list[str] = []  # every committed piece, in order

    def commit(self, text: str) -> None:
        """New committed text (never changes once shown). Raises nothing."""
        self.text.append(text)
        self.tentative = _after(self.tentative, text)  # the guess's words now committed must not show twice
        if not self.tty:
            self.out.write(text)
            self.out.flush()
            return
        self.line += text
        while len(self.line) >= self.width:  # a full line is final: later rewrites touch only the last one
            cut = self.line.rfind(" ", 0, self.width) if " " in self.line[1:self.width] else self.width
            cut = max(1, cut)
            self.out.write("\r\x1b[K" + self.line[:cut] + "\n")
            self.line = self.line[cut:].lstrip()
        self._draw()

    def guess(self, text: str) -> None:
        """The current tentative text after the committed text. Raises nothing."""
        self.tentative = text
        if self.tty:
            self._draw()

    def end_utterance(self) -> None:
        """An utterance is complete: its line ends. Raises nothing."""
        self.tentative = ""
        if self.tty:
            if self.line:
                self.out.write("\r\x1b[K" + self.line + "\n")
        elif self.text and not self.text[-1].endswith("\n"):
            self.out.write("\n")
            self.text.append("\n")
        self.line = ""
        self.out.flush()

    def _draw(self) -> None:
        room = max(0, self.width - 1 - len(self.line))
        guess = self.tentative.strip()
        shown = (" " if guess and self.line and not self.line.endswith(" ") else "") + guess
        if len(shown) > room:
            shown = "…" + shown[-(room - 1):] if room > 1 else ""
        dim = f"\x1b[2m{shown}\x1b[0m" if shown else ""
        self.out.write("\r\x1b[K" + self.line + dim)
        self.out.flush()


def _after(guess: str, committed: str) -> str:
    """What of `guess` follows `committed`, when the guess began with it; else nothing, as a guess cut mid-word
    or one the commit did not follow is stale (the next guess comes with the next decode). Raises nothing."""
    head, words = guess.lstrip(), committed.strip()
    if not words:
        return guess
    rest = head[len(words):] if head.startswith(words) else ""
    return "" if rest[:1].isalnum() else rest


@dataclass
class DictateSession:
    """One Realtime transcription session: configure, send audio, commit, and display what comes back."""

    ws: Any  # a websockets client connection
    display: LiveLine
    log: TextIO = sys.stderr
    pending: set[str] = field(default_factory=set)  # items committed, not yet completed
    completed: int = 0
    spoken: int = 0  # completed utterances with text (a pause in silence completes an empty one)
    errors: list[dict[str, Any]] = field(default_factory=list)
    _acked: anyio.Event = field(default_factory=anyio.Event)
    _drained: anyio.Event = field(default_factory=anyio.Event)
    _updated: anyio.Event = field(default_factory=anyio.Event)
    first_text_at: float | None = None
    _last_shown: tuple[Any, Any] | None = None  # the last error written (code, message)

    async def configure(self, *, rate: int, language: str | None, prompt: str | None, keywords: list[str],
                        vad: bool) -> None:
        """session.update (GA transcription session), then wait for session.updated. Raises RuntimeError
        when the server refuses it."""
        transcription: dict[str, Any] = {"language": language, "prompt": prompt}
        if keywords:
            transcription["keywords"] = keywords
        turn = {"type": "server_vad"} if vad else None
        await self._send({"type": "session.update", "session": {
            "type": "transcription", "include": ["item.input_audio_transcription.tentative"],
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": rate}, "transcription": transcription,
                                "turn_detection": turn}}}})
        await self._updated.wait()
        if self.errors:
            raise RuntimeError(self.errors[-1].get("message", "the server refused the session settings"))

    async def append(self, chunk: bytes) -> None:
        await self._send({"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()})

    async def finish_take(self) -> None:
        """Commit what is left of the take and wait until every item committed so far is transcribed.
        Raises nothing."""
        self._acked = anyio.Event()
        await self._send({"type": "input_audio_buffer.commit", "event_id": FINAL_COMMIT})
        await self._acked.wait()  # its committed event, or the error for an empty buffer
        if self.pending:
            self._drained = anyio.Event()
            await self._drained.wait()

    async def _send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    async def receive(self, messages: Any) -> None:
        """Handle server events (`messages`: an async iterator of text frames, e.g. the websocket) until the
        connection ends. Raises nothing of its own."""
        async for raw in messages:
            event = json.loads(raw)
            kind = event.get("type")
            if kind in ("session.updated", "transcription_session.updated"):
                self._updated.set()
            elif kind == "input_audio_buffer.committed":
                self.pending.add(event["item_id"])
                if event.get("client_event_id") == FINAL_COMMIT:  # this server's echo of the commit's event_id
                    self._acked.set()
            elif kind == "conversation.item.input_audio_transcription.delta":
                if self.first_text_at is None:
                    self.first_text_at = time.perf_counter()
                self.display.commit(event.get("delta") or "")
            elif kind == "conversation.item.input_audio_transcription.tentative":
                self.display.guess(event.get("text") or "")
            elif kind == "conversation.item.input_audio_transcription.completed":
                self.completed += 1
                self.pending.discard(event["item_id"])
                if (event.get("transcript") or "").strip():
                    self.spoken += 1
                if event.get("transcript"):
                    self.display.end_utterance()
                if not self.pending:
                    self._drained.set()
            elif kind == "error":
                error = event.get("error") or {}
                if error.get("event_id") == FINAL_COMMIT:
                    self._acked.set()  # nothing left to commit
                    continue
                self.errors.append(error)
                if not self._updated.is_set():  # a refused update: the caller reports it, once
                    self._updated.set()  # it ends the wait too
                    continue
                shown = (error.get("code"), error.get("message"))
                if shown != self._last_shown:  # a drain refuses every append after it: said once, not per chunk
                    self.log.write(f"\nserver: {error.get('message')} ({error.get('code')})\n")
                    self.log.flush()
                self._last_shown = shown
