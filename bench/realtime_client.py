"""A client of the Realtime transcription socket (`/v1/realtime?intent=transcription`): speaker signals made
of the shared WAV clips (or a synthetic voice), and one session streaming a signal at real time. Used by the
live benchmark (bench/live_serve.py) and the mixed soak's live clients (bench/serve_mixed.py)."""

from __future__ import annotations

import base64
import json
import time
import wave
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import numpy as np

__all__ = ["SR", "CHUNK", "signals", "SessionRun", "stream_session", "realtime_url"]

SR = 16000
CHUNK = SR // 10  # 100 ms
GAP_S = 1.5


def realtime_url(root: str) -> str:
    """The transcription socket of the server at `root` (http[s]://host:port). Raises nothing."""
    return root.replace("http://", "ws://").replace("https://", "wss://") + "/v1/realtime?intent=transcription"


def _wav(path: Path) -> np.ndarray:
    with wave.open(str(path)) as w:
        if w.getframerate() != SR or w.getnchannels() != 1 or w.getsampwidth() != 2:
            raise SystemExit(f"{path}: need 16 kHz mono 16-bit WAV")
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768.0


def _synthetic(k: int) -> list[np.ndarray]:
    """Voiced bursts of 1.5–3.5 s (a buzzing vowel whose pitch varies by speaker and burst)."""
    out = []
    for j in range(6):
        n = int((1.5 + (j + k) % 5 * 0.5) * SR)
        t = np.arange(n) / SR
        f0 = 110 + 17 * ((j * 7 + k * 3) % 9)
        out.append((((t * f0) % 1.0 - 0.5) * 0.5 * (0.55 + 0.45 * np.sin(2 * np.pi * 4 * t))).astype(np.float32))
    return out


def signals(n: int, seconds: float, samples: Path | None,
            gap_s: float = GAP_S) -> list[tuple[np.ndarray, list[tuple[int, int]]]]:
    """n speaker signals of about `seconds`, each starting at another clip, clips `gap_s` apart (0: one utterance
    the VAD never closes), and where each clip lies in it (start, end samples). Raises SystemExit for a samples
    folder without WAVs."""
    clips = [_wav(w) for w in sorted(samples.glob("*.wav"))] if samples is not None else None
    if clips is not None and not clips:
        raise SystemExit(f"no .wav files in {samples}")
    gap = np.zeros(int(gap_s * SR), np.float32)
    out = []
    for k in range(n):
        pool = clips if clips is not None else _synthetic(k)
        lead = np.zeros(SR // 2, np.float32)
        parts, marks, total, i = [lead], [], SR // 2, k
        while total < seconds * SR:
            x = pool[i % len(pool)]
            marks.append((total, total + len(x)))
            parts += [x, gap]
            total += len(x) + len(gap)
            i += 1
        out.append((np.concatenate(parts), marks))
    return out


@dataclass
class SessionRun:
    """What one streamed session saw, in wall-clock seconds (time.perf_counter)."""

    sent_at: list[float] = field(default_factory=list)  # when chunk i went out
    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    last_chunk: float = 0.0
    done: float = 0.0
    error: str | None = None
    complete: bool = False  # the last commit's transcripts all came (the session ended as the client meant)

    def chunk_time(self, sample: int) -> float:
        return self.sent_at[min(len(self.sent_at) - 1, sample // CHUNK)]

    def latencies(self, marks: list[tuple[int, int]]) -> list[dict[str, float | None]]:
        """Per clip: first word after onset, final transcript after end (seconds). Items are matched to a
        clip by where their speech started. Raises nothing."""
        starts: dict[str, int] = {}
        first_word: dict[str, float] = {}
        completed: dict[str, float] = {}
        for t, e in self.events:
            kind, item = e.get("type", ""), e.get("item_id")
            if kind == "input_audio_buffer.speech_started":
                starts[item] = int(e["audio_start_ms"]) * SR // 1000
            elif kind.endswith(("transcription.tentative", "transcription.delta")) and (e.get("text") or e.get("delta")):
                first_word.setdefault(item, t)
            elif kind.endswith("transcription.completed"):
                completed[item] = t
        rows = []
        for a, b in marks:
            mine = [i for i, s in starts.items() if a - SR // 2 <= s < b]
            words = [first_word[i] for i in mine if i in first_word]
            ends = [completed[i] for i in mine if i in completed]
            rows.append({"first_word_s": round(min(words) - self.chunk_time(a), 3) if words else None,
                         "final_s": round(max(ends) - self.chunk_time(b), 3) if ends else None})
        return rows


async def stream_session(url: str, pcm: np.ndarray, headers: dict[str, str], run: SessionRun,
                         stop: anyio.Event | None = None) -> None:
    """One Realtime transcription session: `pcm` at real time (looped until `stop` when given), a final
    commit, then every transcript. Never raises: a failure lands in run.error as "KIND: detail", KIND one of
    error_event (the server's error event), http_N (the handshake refused), closed (the socket closed with an
    error code), transport."""
    import websockets
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    data = (np.clip(pcm, -1, 1) * 32767).astype("<i2")
    try:
        async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:
            first = json.loads(await ws.recv())
            if first.get("type") == "error":  # refused at the start (e.g. the engine restarting)
                run.error = "error_event: " + json.dumps(first.get("error"))[:300]
                run.done = time.perf_counter()
                return
            await ws.send(json.dumps({"type": "session.update", "session": {
                "type": "transcription", "include": ["item.input_audio_transcription.tentative"],
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": SR}}}}}))
            pending: set[str] = set()
            last = anyio.Event()

            async def send() -> None:
                start = time.perf_counter()
                i = 0
                while True:
                    chunk = data[i % len(data): i % len(data) + CHUNK]
                    await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                              "audio": base64.b64encode(chunk.tobytes()).decode()}))
                    run.sent_at.append(time.perf_counter())
                    i += len(chunk)
                    if (stop is None and i >= len(data)) or (stop is not None and stop.is_set()):
                        break
                    await anyio.sleep(max(0.0, start + i / SR - time.perf_counter()))  # a microphone's pace
                run.last_chunk = time.perf_counter()
                await ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": "last"}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(send)
                async for raw in ws:
                    event = json.loads(raw)
                    run.events.append((time.perf_counter(), event))
                    kind = event["type"]
                    if kind == "input_audio_buffer.committed":
                        pending.add(event["item_id"])
                        if event.get("client_event_id") == "last":
                            last.set()
                    elif kind.endswith("transcription.completed"):
                        pending.discard(event["item_id"])
                    elif kind == "error":
                        if event["error"].get("event_id") == "last":
                            last.set()
                        else:
                            run.error = run.error or "error_event: " + json.dumps(event["error"])[:300]
                    if last.is_set() and not pending:
                        run.complete = True
                        break
                tg.cancel_scope.cancel()
            run.done = time.perf_counter()
    except* InvalidStatus as group:
        response = _first(group).response  # type: ignore[attr-defined]
        run.error = f"http_{response.status_code}: {response.body!r}"[:300]
    except* ConnectionClosed as group:  # the server (or the network) ended the session with an error code
        run.error = run.error or f"closed: {_first(group)}"[:300]
    except* Exception as group:  # a benchmark reports, it does not crash
        exc = _first(group)
        run.error = run.error or f"transport: {type(exc).__name__}: {exc}"[:300]
    finally:
        run.done = time.perf_counter()


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf exception of a (nested) group."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
