"""audio/live.py at an utterance's pause: a final decode's text runs to its pause, so the next utterance is decoded
from there — never from Whisper's last timestamp before it, whose tail the next item repeated."""

from __future__ import annotations

from typing import Any

import pytest

from audio.decoder import RowResult
from audio.live import LiveConfig, LiveTranscription, SessionEvent
from audio.transcript import TranscribeOptions
from audio.whisper import LoadedWhisper
from audio.window import WindowRequest, WindowResult
from tests.audio.test_live import SR, Scripted, run_due, speech

pytestmark = pytest.mark.anyio


class Listening(Scripted):
    """A stand-in Whisper that hears phrases said at compact positions (seconds): a decode writes, after its forced
    prefix, each phrase its audio holds past the prefix's last timestamp, as a segment whose timestamps come 0.3 and
    0.1 s before the phrase is said (Whisper's last timestamp often lies before an utterance's last word ends)."""

    def __init__(self, tok: Any, said: list[tuple[float, str]], seek: Any) -> None:
        super().__init__([])
        self.tok, self.said, self.seek = tok, said, seek

    async def decode(self, loaded: Any, request: WindowRequest, cancellation: Any = None) -> WindowResult:
        self.requests.append(request)
        ts, seek = self.tok.timestamp_begin, self.seek() / SR
        stamps = [t - ts for t in request.prefix if t >= ts]
        heard_from, last = seek + (stamps[-1] * 0.02 if stamps else 0.0), stamps[-1] if stamps else 0
        cont: list[int] = []
        for at, text in self.said:
            if heard_from <= at < seek + len(request.audio) / SR:
                start = max(last, round((at - 0.3 - seek) / 0.02))
                last = max(start, round((at - 0.1 - seek) / 0.02))
                cont += [ts + start, *self.tok.encode(text), ts + last]
        return WindowResult(RowResult(list(request.prefix) + cont, cont, "", -0.1, 0.01, 0.0, 1.0), "en")


@pytest.mark.parametrize("behind", [False, True])
@pytest.mark.parametrize("trim_s", [1.0, 15.0])
async def test_the_next_utterance_is_decoded_from_the_pause_not_from_the_last_timestamp(
        tiny_whisper: LoadedWhisper, behind: bool, trim_s: float) -> None:
    # rt_burst: an utterance's final decode closed its text at 37.32 s, its pause came at 38.1 s, and the next decode
    # began at 37.32 s (trimmed there, or its forced prefix ending there): the next item began "5, 8 of spades",
    # repeating the "5." that ended the item before. The text of a final not stopped short runs to its pause.
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    said = [(1.0, " Five,"), (2.5, " five."), (4.5, " Eight of spades."), (6.5, " Ten of clubs.")]
    events: list[SessionEvent] = []
    live: LiveTranscription | None = None
    scheduler = Listening(tok, said, lambda: live._seek())  # type: ignore[union-attr]
    live = LiveTranscription(TranscribeOptions(), LiveConfig(first_commit_s=0.0, trim_s=trim_s, tokens_per_second=1.0),
                             scheduler, events.append)  # type: ignore[arg-type]
    await live.start(tiny_whisper)
    for k, (start, end) in enumerate(((0.0, 3.0), (3.0, 5.0), (5.0, 7.0))):  # utterances, their pauses at their ends
        live.add_speech(speech(end - start), int(start * SR))
        live.add_pause()
        if not (behind and k == 0):  # behind: the first two are decoded at once
            assert await run_due(live) == 1
    assert len(scheduler.requests) == 3 - behind
    items = [e.text for e in events if e.type == "utterance"]
    assert items == [" Five, five.", " Eight of spades.", " Ten of clubs."]
    assert live.committed_text() == "".join(items)
    last = scheduler.requests[-1]  # trimmed at the pause, or its forced text closed there (5.0 s)
    ts = tok.timestamp_begin
    assert (len(last.audio), last.prefix[-1:]) == ((2 * SR, ()) if trim_s < 2 else (7 * SR, (ts + 250,)))
