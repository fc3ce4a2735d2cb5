"""audio/live.py with token log probabilities asked for (a Realtime session's `include` of
`item.input_audio_transcription.logprobs`): the decodes keep them, each committed piece carries its own tokens' —
those of the decode that wrote it, less any repeat left out of the text — and each utterance all of its text's."""

from __future__ import annotations

from typing import Any

import pytest

from audio.decoder import RowResult
from audio.live import LiveConfig, LiveTranscription, SessionEvent
from audio.token_logprobs import FLOOR, TokenLogprob
from audio.transcript import TranscribeOptions
from audio.whisper import LoadedWhisper
from audio.window import WindowRequest, WindowResult
from tests.audio.test_live import SR, Scripted, run_due, speech

pytestmark = pytest.mark.anyio


def lp(decode: int, i: int) -> float:
    """The log probability the scripted decode `decode` gives its `i`th sampled token: each is its own."""
    return -(decode * 100 + i + 1) / 1000


class WithLogprobs(Scripted):
    """Scripted decodes that keep their sampled tokens' log probabilities when the request asks for them."""

    async def decode(self, loaded: Any, request: WindowRequest, cancellation: Any = None) -> WindowResult:
        n = len(self.requests)
        result = await super().decode(loaded, request, cancellation)
        d = result.decoded
        kept = tuple(lp(n, i) for i in range(len(d.sampled))) if request.logprobs else None
        return WindowResult(RowResult(d.tokens, d.sampled, d.text, d.avg_logprob, d.no_speech_prob, d.temperature,
                                      d.compression_ratio, kept), result.language)


async def live_text(loaded: LoadedWhisper, script: list[list[int]], logprobs: bool = True,
                    **config: float) -> tuple[LiveTranscription, WithLogprobs, list[SessionEvent]]:
    events: list[SessionEvent] = []
    scheduler = WithLogprobs(script)
    config.setdefault("first_commit_s", 0.0)  # scripts of a few seconds (the first commit's wait: test_live.py)
    live = LiveTranscription(TranscribeOptions(logprobs=logprobs), LiveConfig(**config), scheduler,  # type: ignore[arg-type]
                             events.append)
    await live.start(loaded)
    return live, scheduler, events


def text_of(entries: tuple[TokenLogprob, ...] | None) -> str:
    assert entries is not None
    return bytes(b for e in entries for b in e.bytes).decode()


async def test_committed_pieces_carry_their_decodes_logprobs_and_the_utterance_all_of_them(
        tiny_whisper: LoadedWhisper) -> None:
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    ts = tok.timestamp_begin
    w = {word: tok.encode(" " + word)[0] for word in ("The", "quick", "brown", "fox")}
    live, scheduler, events = await live_text(tiny_whisper, [
        [ts, w["The"], w["quick"]],
        [ts, w["The"], w["quick"], w["brown"]],
        [w["quick"], w["brown"], w["fox"]],  # after the committed prefix (ts, The)
        [w["brown"], w["fox"], ts + 150],  # the pause's decode, after (ts, The, quick)
    ])
    at = 0
    for seconds in (1.2, 1.0, 1.0):
        live.add_speech(speech(seconds), at)
        at += int(seconds * SR)
        await run_due(live)
    live.add_pause()
    await run_due(live)
    assert all(r.logprobs for r in scheduler.requests)
    committed = [e for e in events if e.type == "committed"]
    assert [e.text for e in committed] == [" The", " quick", " brown fox"]
    assert [text_of(e.logprobs) for e in committed] == [e.text for e in committed]
    # each piece's values are the decode's that committed it, at the positions its tokens were sampled at
    assert [[x.logprob for x in e.logprobs or ()] for e in committed] == [
        [lp(1, 1)], [lp(2, 0)], [lp(3, 0), lp(3, 1)]]
    assert committed[0].logprobs == (TokenLogprob(" The", lp(1, 1), tuple(b" The")),)
    (utterance,) = [e for e in events if e.type == "utterance"]
    assert utterance.logprobs == tuple(x for e in committed for x in e.logprobs or ())


async def test_a_repeat_left_out_of_the_text_leaves_its_tokens_out(tiny_whisper: LoadedWhisper) -> None:
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    ts = tok.timestamp_begin
    said = tok.encode(" Ten of clubs.")
    live, _, events = await live_text(tiny_whisper, [[ts, *said, ts + 100, ts + 100, *said, ts + 150]])
    live.add_speech(speech(3.0), 0)
    live.add_pause()
    await run_due(live)
    (utterance,) = [e for e in events if e.type == "utterance"]
    assert utterance.text == " Ten of clubs." and text_of(utterance.logprobs) == utterance.text
    assert [x.logprob for x in utterance.logprobs or ()] == [lp(0, 1 + i) for i in range(len(said))]  # the first


async def test_a_token_across_a_repeats_edge_keeps_only_its_kept_bytes(tiny_whisper: LoadedWhisper) -> None:
    # `."` ends the sentence kept and opens the repeat after it: the text keeps its `.`, and so do its bytes.
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    ts = tok.timestamp_begin
    said = tok.encode(' He said no." He said no.')
    assert tok.encoding.decode_single_token_bytes(said[3]) == b'."'
    live, _, events = await live_text(tiny_whisper, [[ts, *said, ts + 150]])
    live.add_speech(speech(3.0), 0)
    live.add_pause()
    await run_due(live)
    (utterance,) = [e for e in events if e.type == "utterance"]
    assert utterance.text == " He said no." and text_of(utterance.logprobs) == utterance.text
    assert (utterance.logprobs or ())[-1] == TokenLogprob(".", lp(0, 4), tuple(b"."))  # its logprob as sampled


def test_less_leading_cuts_bytes_from_the_first_tokens_keeping_their_logprobs() -> None:
    from audio.token_logprobs import less_leading

    entries = (TokenLogprob(" ", -0.1, (32,)), TokenLogprob(" And", -0.2, tuple(b" And")),
               TokenLogprob(" Mr", -0.3, tuple(b" Mr")))
    assert less_leading(entries, 0) == entries
    assert less_leading(entries, 2) == (TokenLogprob("And", -0.2, tuple(b"And")), entries[2])
    assert less_leading(entries, 1) == entries[1:] and less_leading(entries, 99) == ()


async def test_a_session_behind_gives_each_utterance_its_own_tokens(tiny_whisper: LoadedWhisper) -> None:
    from audio.decoding import tokenizer_for

    ts = tokenizer_for(tiny_whisper, "en", "transcribe").timestamp_begin
    merged = [ts, 1000, ts + 50, ts + 50, 1002, ts + 100, ts + 100, 1004, ts + 150]
    live, _, events = await live_text(tiny_whisper, [merged], tokens_per_second=1.0)
    for k in range(3):
        live.add_speech(speech(1.0), k * 2 * SR)
        live.add_pause()
    await run_due(live)
    closed = [e for e in events if e.type == "utterance"]
    assert [[x.logprob for x in e.logprobs or ()] for e in closed] == [[lp(0, 1)], [lp(0, 4)], [lp(0, 7)]]
    assert [text_of(e.logprobs) for e in closed] == [e.text for e in closed]


async def test_without_logprobs_none_are_kept_and_asked_for_later_they_come_with_the_next_decodes(
        tiny_whisper: LoadedWhisper) -> None:
    live, scheduler, events = await live_text(tiny_whisper, [[1000, 1001], [1002]], logprobs=False)
    live.add_speech(speech(1.5), 0)
    live.add_pause()
    await run_due(live)
    assert not scheduler.requests[0].logprobs
    assert all(e.logprobs is None for e in events if e.type in ("committed", "utterance"))
    live.logprobs = True  # LiveSession.reconfigure: the decodes from here on keep them
    live.add_speech(speech(1.5), 2 * SR)
    live.add_pause()
    await run_due(live)
    assert scheduler.requests[1].logprobs
    last = [e for e in events if e.type == "utterance"][-1]
    assert last.logprobs is not None and [x.logprob for x in last.logprobs] == [lp(1, 0)]


def test_a_probability_too_small_to_show_is_openais_floor(tiny_whisper: LoadedWhisper) -> None:
    from audio.decoding import tokenizer_for
    from audio.token_logprobs import token_logprobs

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    entries = token_logprobs(tok, [tok.timestamp_begin, 1000, 1001, tok.eot], [None, float("nan"), float("-inf"), -1.0])
    assert [e.logprob for e in entries] == [FLOOR, FLOOR]  # JSON has no NaN or -Infinity; timestamps are no text
