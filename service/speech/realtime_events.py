"""The server events of a Realtime transcription session, built from a live session's events
(audio/live.py SessionEvent), with OpenAI's shapes (openai-python's types/realtime and types/beta/realtime).

Items: each utterance of the session is one user message item. Its id is announced by
`input_audio_buffer.speech_started` (server VAD), else by `input_audio_buffer.committed`, which comes with
`conversation.item.created` when its audio ends (a VAD pause or a client commit) — on a GA session (OpenAI's GA
events, which have no `created`: async-openai's GA events fail on it) with `conversation.item.added` then
`conversation.item.done`, the item complete but for its transcript, which the transcription events bring;
`conversation.item.input_audio_transcription.completed` carries its final text. Live text:
`conversation.item.input_audio_transcription.delta` events carry text as it is committed (LocalAgreement-2), so
with server VAD they may come before the item's `committed`, under the id `speech_started` announced. No event
names an item before it is announced: with manual commits (no speech_started) text is held until `committed`,
then sent as one delta, as OpenAI transcribes a buffer once it is committed; guesses before it are not shown. A
client that asked for our `tentative` extension knows items early: its text and guesses flow as they come.
The deltas of an item add up to its `completed` transcript, which comes without Whisper's leading space, as a
transcription's text does (so the item's first delta has none either). A committed item whose transcript will not
come (the socket ends first: a shutdown, the engine process gone) gets `...input_audio_transcription.failed`.
With `include: ["item.input_audio_transcription.logprobs"]` each delta and each `completed` carries `logprobs`, the
log probabilities of the tokens Whisper wrote its text with ({token, logprob, bytes}), null where they are not known
for all of it (they were asked for after some of its text was decoded). An event's logprobs' bytes join to exactly
its text: where the text leaves out Whisper's leading space, its first token's `token` and `bytes` leave it out too
(its logprob unchanged; a token of whitespace alone goes), so `completed`'s are its deltas' one after another.
For gpt-live-transcribe and gpt-transcribe, `completed` carries OpenAI's `languages` ([{"code"}]: the language its
text was decoded in; [] for an empty transcript). Its `usage` is OpenAI's for the session's model: tokens for those
billed by tokens (gpt-4o-transcribe, gpt-4o-mini-transcribe), else the item's seconds of audio.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

from audio.live import SessionEvent
from audio.token_logprobs import TokenLogprob, less_leading
from audio.formats import usage as duration_usage
from service.speech.transcription_fields import detected_languages

__all__ = ["Items", "server_events", "transcription_failed"]


@dataclass
class _Item:
    id: str
    start_ms: int = 0
    end_ms: int = 0
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = field(default_factory=list)  # its text's tokens' (None: not known for all)
    announced: bool = False  # the client was told of its id (speech_started or committed); until then text waits
    created: bool = False  # committed: its item event went out (`created`, GA's `added`), its transcript is owed


class Items:
    """Item ids by utterance number, and what each item has heard so far."""

    def __init__(self) -> None:
        self._items: dict[int, _Item] = {}
        self.last_created: str | None = None
        self._boundary_ms = 0  # where the next utterance's audio starts

    def get(self, k: int) -> _Item:
        item = self._items.get(k)
        if item is None:
            item = self._items[k] = _Item(f"item_{uuid.uuid4().hex[:24]}", self._boundary_ms)
        return item

    def renew(self, k: int, at_ms: int) -> None:
        """Utterance k's audio up to `at_ms` was cleared: its next audio gets a new item. Raises nothing."""
        self._boundary_ms = at_ms
        if k in self._items and not self._items[k].text:
            del self._items[k]

    def created(self, k: int, end_ms: int) -> tuple[_Item, str | None]:
        item = self.get(k)
        item.announced = item.created = True
        previous, self.last_created = self.last_created, item.id
        item.end_ms = self._boundary_ms = end_ms
        return item, previous

    def forget(self, k: int) -> None:
        self._items.pop(k, None)

    def owed(self) -> list[str]:
        """The ids of the items created whose transcript has not come (`completed` forgets an item), oldest first.
        Raises nothing."""
        return [item.id for _, item in sorted(self._items.items()) if item.created]


def transcription_failed(items: Items, error: dict[str, Any]) -> list[dict[str, Any]]:
    """OpenAI's `...input_audio_transcription.failed` for every item whose transcript will not come now (the session
    ended first: a shutdown, an engine process gone), each carrying `error` ({type, code, message, param}). Raises
    nothing."""
    return [{"type": "conversation.item.input_audio_transcription.failed", "item_id": item_id, "content_index": 0,
             "error": error} for item_id in items.owed()]


def server_events(ev: SessionEvent, items: Items, tentative: bool, lag: Callable[[], float] = lambda: 0.0,
                  logprobs: bool = False, model: str | None = None, ga: bool = False,
                  usage: Callable[[str, float], dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The Realtime server events for one session event (event ids added by the sender); `logprobs`: deltas and
    transcripts carry their tokens' log probabilities; `model`, the session's transcription model: transcripts name
    the language heard if OpenAI's do for it (gpt-live-transcribe's `languages`); `ga`: a GA session's item events
    (`conversation.item.added` and `.done`, the beta's `conversation.item.created` otherwise); `usage`: a
    transcript's usage for its text and seconds of audio (transcription_fields.utterance_usage; None: the seconds).
    Raises what `usage` raises."""
    k = ev.item
    if ev.type == "speech_started":
        item = items.get(k)
        item.start_ms, item.announced = ev.audio_ms or 0, True
        return [{"type": "input_audio_buffer.speech_started", "audio_start_ms": ev.audio_ms or 0, "item_id": item.id}]
    if ev.type == "speech_stopped":
        return [{"type": "input_audio_buffer.speech_stopped", "audio_end_ms": ev.audio_ms or 0,
                 "item_id": items.get(k).id}]
    if ev.type == "audio_committed":
        held = "" if items.get(k).announced else "".join(items.get(k).text)
        held_logprobs = items.get(k).logprobs
        item, previous = items.created(k, ev.audio_ms or 0)
        committed: dict[str, Any] = {"type": "input_audio_buffer.committed", "item_id": item.id,
                                     "previous_item_id": previous}
        if ev.ref is not None:  # extension: which client commit closed it (the event_id the client gave)
            committed["client_event_id"] = ev.ref
        user = {"id": item.id, "object": "realtime.item", "type": "message", "status": "completed", "role": "user",
                "content": [{"type": "input_audio", "transcript": None}]}
        kinds = ("conversation.item.added", "conversation.item.done") if ga else ("conversation.item.created",)
        return [committed, *({"type": kind, "previous_item_id": previous, "item": user} for kind in kinds),
                *([_delta(item.id, held, held_logprobs if logprobs else False)] if held else [])]
    if ev.type == "committed":
        item = items.get(k)
        delta = ev.text if "".join(item.text) else ev.text.lstrip()
        if not delta:
            return []
        item.text.append(delta)
        entries = _as_stripped(ev.logprobs, ev.text, delta)
        if entries is None or item.logprobs is None:
            item.logprobs = None
        else:
            item.logprobs.extend(entries)
        if not item.announced and not tentative:  # an id the client has not heard of yet: sent once `committed` is
            return []
        item.announced = True  # (our extension's clients: `tandem dictate --no-vad` shows text as it comes)
        return [_delta(item.id, delta, entries if logprobs else False)]
    if ev.type == "tentative":
        if not tentative:
            return []
        # Our extension also says how far behind the session is (`lag`: received audio not yet transcribed).
        return [{"type": "conversation.item.input_audio_transcription.tentative", "item_id": items.get(k).id,
                 "content_index": 0, "text": ev.text, "lag_seconds": lag()}]
    if ev.type == "utterance":
        item = items.get(k)
        seconds = max(0, item.end_ms - item.start_ms) / 1000
        items.forget(k)
        transcript = ev.text.lstrip()
        completed = {"type": "conversation.item.input_audio_transcription.completed", "item_id": item.id,
                     "content_index": 0, "transcript": transcript,
                     "usage": usage(transcript, seconds) if usage is not None else duration_usage(seconds)}
        if (heard := detected_languages(model, ev.language, transcript)) is not None:
            completed["languages"] = heard
        if logprobs:
            completed["logprobs"] = _logprobs(_as_stripped(ev.logprobs, ev.text, transcript))
        return [completed]
    if ev.type == "cleared":
        items.renew(k, ev.audio_ms or 0)
        return [{"type": "input_audio_buffer.cleared"}]
    return []


def _delta(item_id: str, text: str,
           logprobs: "Sequence[TokenLogprob] | None | Literal[False]" = False) -> dict[str, Any]:
    """A delta event; with `logprobs` other than False (not asked for), its `logprobs`. Raises nothing."""
    out = {"type": "conversation.item.input_audio_transcription.delta", "item_id": item_id, "content_index": 0,
           "delta": text}
    if logprobs is not False:
        out["logprobs"] = _logprobs(logprobs)
    return out


def _as_stripped(entries: Sequence[TokenLogprob] | None, text: str, stripped: str) -> Sequence[TokenLogprob] | None:
    """`entries` (`text`'s tokens') as `stripped` (`text` less leading whitespace) holds them: the stripped bytes
    gone from its first tokens too. Raises nothing."""
    if entries is None or stripped == text:
        return entries
    return less_leading(entries, len(text[:len(text) - len(stripped)].encode()))


def _logprobs(entries: Sequence[TokenLogprob] | None) -> list[dict[str, Any]] | None:
    return None if entries is None else [e.as_dict() for e in entries]
