"""audio/live.py: the commit rules of live text, with scripted decodes — committed text only grows, tentative
text never repeats it, pauses commit everything, finished segments are trimmed, 30 s of speech is a window."""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

from audio.decoder import RowResult
from audio.encoder import fitted_context
from audio.live import LiveConfig, LiveTranscription, SessionEvent
from audio.window import WindowRequest, WindowResult
from audio.transcript import TranscribeOptions
from audio.whisper import LoadedWhisper

pytestmark = pytest.mark.anyio
SR = 16000


class Scripted:
    """A scheduler whose decodes return scripted continuations after the forced prefix."""

    def __init__(self, continuations: list[list[int]]) -> None:
        self.continuations = continuations
        self.requests: list[WindowRequest] = []
        self.chat = True  # whether chat has rows (WhisperScheduler.chat_active)

    def chat_active(self) -> bool:
        return self.chat

    async def decode(self, loaded: Any, request: WindowRequest, cancellation: Any = None) -> WindowResult:
        self.requests.append(request)
        cont = self.continuations.pop(0)
        tokens = list(request.prefix) + cont
        return WindowResult(RowResult(tokens, cont, "", -0.1, 0.01, 0.0, 1.0), "en")


async def live_text(loaded: LoadedWhisper, script: list[list[int]], **config: float) -> tuple[
        LiveTranscription, Scripted, list[SessionEvent]]:
    events: list[SessionEvent] = []
    scheduler = Scripted(script)
    config.setdefault("first_commit_s", 0.0)  # scripts of a few seconds: the first commit's wait is tested on its own
    live = LiveTranscription(TranscribeOptions(), LiveConfig(**config), scheduler, events.append)  # type: ignore[arg-type]
    await live.start(loaded)
    return live, scheduler, events


async def run_due(live: LiveTranscription, finishing: bool = False) -> int:
    n = 0
    while (action := live.next_action(finishing)) is not None:
        await action()
        n += 1
    return n


def speech(seconds: float) -> np.ndarray:
    return np.full(int(seconds * SR), 0.1, np.float32)


async def test_agreeing_decodes_commit_and_the_rest_stays_tentative(tiny_whisper: LoadedWhisper) -> None:
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    ts = tok.timestamp_begin
    w = {word: tok.encode(" " + word)[0] for word in ("The", "quick", "brown", "fox")}
    live, scheduler, events = await live_text(tiny_whisper, [
        [ts, w["The"], w["quick"]],
        [ts, w["The"], w["quick"], w["brown"]],
        [w["quick"], w["brown"], w["fox"]],  # continuations: after the committed prefix
        [w["brown"], w["fox"], ts + 150],  # the pause's decode
    ])
    at = 0
    for seconds in (1.2, 1.0, 1.0):
        live.add_speech(speech(seconds), at)
        at += int(seconds * SR)
        assert await run_due(live) == 1
    assert [r.prefix for r in scheduler.requests] == [(), (), (ts, w["The"])]
    assert live.committed_text() == " The quick" and live.tentative == " brown fox"
    live.add_pause()
    assert await run_due(live) == 1
    assert scheduler.requests[-1].prefix == (ts, w["The"], w["quick"])
    assert live.committed_text() == " The quick brown fox" and live.tentative == ""
    kinds = [(e.type, e.text) for e in events]
    assert kinds == [("tentative", " The quick"), ("committed", " The"), ("tentative", " quick brown"),
                     ("committed", " quick"), ("tentative", " brown fox"), ("committed", " brown fox"),
                     ("tentative", ""), ("utterance", " The quick brown fox")]
    committed = ""
    for e in events:
        if e.type == "committed":
            committed += e.text
        elif e.type == "tentative" and e.text:
            assert not committed.endswith(e.text.split()[0]) or e.text.split()[0] not in committed.split()[-1:]
    t = live.transcript(3.2)
    assert t.text == " The quick brown fox" and all(0 <= s.start <= s.end <= 3.2 for s in t.segments)


async def test_finished_segments_are_trimmed_and_the_prefix_moves_with_them(tiny_whisper: LoadedWhisper) -> None:
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    ts = tok.timestamp_begin
    a, b, c = (tok.encode(" " + word)[0] for word in ("one", "two", "three"))
    seg1 = [ts, a, ts + 50, ts + 50]  # " one" from 0.0 to 1.0 s, then a new segment opens at 1.0 s
    live, scheduler, _ = await live_text(tiny_whisper, [seg1 + [b], seg1 + [b, c], [b, c]], trim_s=1.0)
    live.add_speech(speech(1.5), 0)
    await run_due(live)
    live.add_speech(speech(1.0), int(1.5 * SR))
    await run_due(live)  # agrees on seg1 (the last shared word may still grow): complete, and open > trim_s
    assert live.committed_text() == " one"
    assert live._tr.seek == 100  # trimmed at the segment's end, 1.0 s
    assert live._live.prefix == [ts] and live._live.previous == [b, c]  # the next segment's opening, at 0.0
    live.add_speech(speech(1.0), int(2.5 * SR))
    await run_due(live)
    request = scheduler.requests[-1]
    assert request.prefix == (ts,) and request.frames == 250  # 3.5 s received, 1.0 s trimmed
    assert live.committed_text() == " one two"
    t = live.transcript(3.5)
    assert t.segments[0].text == " one" and (t.segments[0].start, t.segments[0].end) == (0.0, 1.0)
    assert t.text == live.committed_text()


async def test_thirty_seconds_without_a_pause_is_decoded_as_one_window(tiny_whisper: LoadedWhisper) -> None:
    live, scheduler, _ = await live_text(tiny_whisper, [[1000, 1002]])
    live.add_speech(speech(31), 0)
    action = live.next_action(False)
    assert action is not None
    await action()
    assert scheduler.requests[0].frames == 3000
    assert live.committed_text() != "" and live._tr.seek == 3000


async def test_decodes_encode_the_open_audio_not_the_whole_window(tiny_whisper: LoadedWhisper) -> None:
    live, scheduler, _ = await live_text(tiny_whisper, [[1000]] * 20, context="fit")  # type: ignore[arg-type]
    at = 0
    for seconds in (1.2, 3.0, 8.0, 31.0):
        live.add_speech(speech(seconds), at)
        at += int(seconds * SR)
        await run_due(live)
    # the open audio plus 1 s, in steps of 5 s, at least 10 s: 4.2 s → 500 positions, 12.2 s → 750, 30 s → 1500;
    # under 2.5 s the whole window
    contexts = [(len(r.audio) / SR, r.audio_ctx) for r in scheduler.requests]
    assert (1.2, None) in contexts and (30.0, 1500) in contexts and any(c == 750 for _, c in contexts)
    assert any(c == 500 for _, c in contexts)
    assert all(c == (fitted_context(1500, int(s * SR), 10.0) if s >= 2.5 else None) for s, c in contexts)
    # a guess (probe) over a cut context is not redone whole when it fails: the next guess comes a second later
    assert {r.redo_whole for r in scheduler.requests if r.audio_ctx is not None and r.temperatures == (0.0,)} == {False}
    assert all(r.redo_whole for r in scheduler.requests if len(r.temperatures) > 1)
    whole, scripted, _ = await live_text(tiny_whisper, [[1000]], context="whole")  # type: ignore[arg-type]
    whole.add_speech(speech(4.0), 0)
    await run_due(whole)
    assert scripted.requests[0].audio_ctx is None


async def test_a_guess_samples_no_more_than_the_speech_after_the_last_final_could_hold(
        tiny_whisper: LoadedWhisper) -> None:
    live, scheduler, _ = await live_text(tiny_whisper, [[1000, 1002], [1004], [1004]],
                                         tokens_per_second=2.0)  # type: ignore[arg-type]
    live.add_speech(speech(3.0), 0)
    live.add_pause()
    await run_due(live)  # the first utterance's final: its text is forced from now on
    live.add_speech(speech(1.0), 4 * SR)
    await run_due(live)
    final, guess = scheduler.requests[-2], scheduler.requests[-1]
    assert guess.temperatures == (0.0,) and len(guess.audio) == 4 * SR  # the open audio: both utterances
    assert guess.sample_len == 16 + 2  # 1 s of fresh speech at 2 tokens a second, not 4 s of open audio
    assert final.sample_len == 16 + 6  # a final writes all of its audio


async def test_a_looping_guess_over_a_cut_context_is_no_guess(tiny_whisper: LoadedWhisper) -> None:
    # Two such guesses would agree and commit the loop; with no earlier text to condition it, its head still shows
    # (" 5, 5." said once came back as " 5, 5. 5, 5. 5, 5." guess after guess on this CPU).
    shown, committed = {}, {}
    for context in ("fit", "whole"):
        live, scheduler, _ = await live_text(tiny_whisper, [[1000, 1000, 1000]] * 2, context=context)  # type: ignore[arg-type]
        live.add_speech(speech(3.0), 0)
        await run_due(live)
        assert scheduler.requests[0].temperatures == (0.0,)  # a guess
        shown[context] = live.tentative
        live.add_speech(speech(1.0), 3 * SR)
        await run_due(live)  # the same loop again
        committed[context] = live.committed_text()
    one = live._text([1000])
    assert shown == {"fit": one, "whole": one * 3}  # over the whole window a short repeat may be speech
    assert committed["fit"] == ""  # a loop over a cut context is never agreed on


class Scored(Scripted):
    """Scripted decodes with the scores a threshold reads: (continuation, avg_logprob, compression_ratio)."""

    def __init__(self, scored: list[tuple[list[int], float, float]]) -> None:
        super().__init__([c for c, _, _ in scored])
        self.scores = [(lp, cr) for _, lp, cr in scored]

    async def decode(self, loaded: Any, request: WindowRequest, cancellation: Any = None) -> WindowResult:
        result = await super().decode(loaded, request, cancellation)
        lp, cr = self.scores.pop(0)
        d = result.decoded
        return WindowResult(RowResult(d.tokens, d.sampled, "", lp, 0.01, 0.0, cr), "en")


async def test_an_improbable_guess_shows_as_tentative_and_a_repetitive_one_does_not(tiny_whisper: LoadedWhisper) -> None:
    # Cut mid-speech, a guess of a word or two ends uncertain: under the logprob threshold (-1.0) it still shows
    # (on this CPU such first guesses, " 4" for "four queen of clubs", held first words back ~1.2 s a clip), and
    # only what a later guess repeats is committed. A guess over the compression threshold (2.4) is a loop: no guess.
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    four = tok.encode(" four")[0]
    for (lp, cr), shown in [((-1.6, 1.0), " four"), ((-0.2, 3.0), ""), ((-0.2, 1.0), " four")]:
        events: list[SessionEvent] = []
        scheduler = Scored([([four], lp, cr)])
        live = LiveTranscription(TranscribeOptions(), LiveConfig(context="whole"), scheduler,  # type: ignore[arg-type]
                                 events.append)
        await live.start(tiny_whisper)
        live.add_speech(speech(1.0), 0)
        assert await run_due(live) == 1
        assert live.tentative == shown and live.committed_text() == "", (lp, cr)
        assert [e.text for e in events if e.type == "tentative"] == ([shown] if shown else [])


async def test_guesses_are_fitted_at_any_length_only_while_chat_has_no_rows(tiny_whisper: LoadedWhisper) -> None:
    # A whole-window guess cost a first word 1.0-1.5 s on a slow 2-core CPU; fitted it is cheap, but beside chat
    # fitted guesses raised chat's token gaps, so they stay whole there. Finals under 2.25 s stay whole either way.
    contexts = {}
    for chat in (False, True):
        live, scheduler, _ = await live_text(tiny_whisper, [[1000], [1000]], context="fit")  # type: ignore[arg-type]
        scheduler.chat = chat
        live.add_speech(speech(1.2), 0)
        await run_due(live)  # a guess
        live.add_pause()
        await run_due(live)  # the utterance's final
        assert [r.temperatures == (0.0,) for r in scheduler.requests] == [True, False]
        contexts[chat] = [r.audio_ctx for r in scheduler.requests]
    assert contexts == {False: [fitted_context(1500, int(1.2 * SR), 10.0), None], True: [None, None]}
    assert LiveConfig(context="fit").fits(SR, any_length=True) and not LiveConfig(context="fit").fits(SR)
    assert not LiveConfig(context="whole").fits(5 * SR, any_length=True)
    off, scripted, _ = await live_text(tiny_whisper, [[1000]], context="fit",  # type: ignore[arg-type]
                                       fit_guesses_alone=False)
    scripted.chat = False
    off.add_speech(speech(1.2), 0)
    await run_due(off)
    assert scripted.requests[0].audio_ctx is None


def test_auto_fits_the_context_on_a_cpu_only_and_short_audio_is_whole_either_way() -> None:
    import mlx.core as mx

    on_cpu = mx.default_device().type == mx.DeviceType.cpu
    assert LiveConfig().fits(5 * SR) is on_cpu and LiveConfig(context="fit").fits(5 * SR)
    assert not LiveConfig(context="fit").fits(2 * SR) and not LiveConfig(context="whole").fits(5 * SR)
    # a second utterance's first guess over ~2.4 s of open audio is fitted (a whole window cost it 0.8 s here)
    assert LiveConfig(context="fit").fits(int(2.3 * SR)) and not LiveConfig(context="fit").fits(int(2.2 * SR))


async def test_finishing_commits_the_rest(tiny_whisper: LoadedWhisper) -> None:
    live, scheduler, events = await live_text(tiny_whisper, [[1000], [1000, 1002]])
    live.add_speech(speech(1.5), 0)
    await run_due(live)
    assert live.committed_text() == ""
    assert await run_due(live, finishing=True) == 1
    assert live.committed_text() != "" and live.next_action(True) is None
    assert live.transcript(1.5).text == live.committed_text()


async def test_a_session_behind_finishes_its_pending_utterances_with_one_decode(tiny_whisper: LoadedWhisper) -> None:
    from audio.decoding import tokenizer_for

    ts = tokenizer_for(tiny_whisper, "en", "transcribe").timestamp_begin
    # a slow speaker (1 token a second): the tiny model's 32 sampled tokens cover all three utterances, each its
    # own segment (0-1 s, 1-2 s, 2-3 s: timestamps count 20 ms)
    one = [ts, 1000, ts + 50], [ts + 50, 1002, ts + 100], [ts + 100, 1004, ts + 150]
    live, scheduler, events = await live_text(tiny_whisper, [[*one[0], *one[1], *one[2]]], tokens_per_second=1.0)
    for k in range(3):  # three utterances arrive before the pump gets to run
        live.add_speech(speech(1.0), k * 2 * SR)
        live.add_pause()
    assert await run_due(live) == 1
    assert scheduler.requests[0].frames == 300
    # every pause closes its utterance with its own text (they used to all go to the first)
    closed = [(e.item, e.text) for e in events if e.type == "utterance"]
    assert closed == [(0, live._text([1000])), (1, live._text([1002])), (2, live._text([1004]))]
    assert [(e.item, e.text) for e in events if e.type == "committed"] == closed
    assert live.committed_text() == live._text([1000, 1002, 1004])


class Aligning(Scripted):
    """A scheduler whose decodes keep an encoder output where asked (a stand-in: the alignment is scripted), and
    whose tasks run at once."""

    def __init__(self, continuations: list[list[int]]) -> None:
        super().__init__(continuations)
        self.tasks = self
        self.aligned = 0

    async def decode(self, loaded: Any, request: WindowRequest, cancellation: Any = None) -> WindowResult:
        result = await super().decode(loaded, request, cancellation)
        result.features = np.zeros((1, 1500, 1)) if request.keep_features else None
        return result

    async def run(self, work: Any, label: str = "") -> Any:
        self.aligned += 1
        return work()


async def test_a_session_behind_splits_a_segment_over_several_utterances_by_its_words(
        tiny_whisper: LoadedWhisper, monkeypatch: pytest.MonkeyPatch) -> None:
    # tiny.en wrote one segment over five utterances of VAD-trimmed speech (its timestamps on whole seconds), and
    # the utterance around its middle got all the text, the others ''. Three utterances here, 1 s each at 0, 3
    # and 6 s, their silence cut out: one segment from 0 to 3 s of the speech-only audio; its words said at
    # 0.2-0.8 s, 1.2-1.8 s and 2.2-2.8 s of it (the alignment, scripted), each utterance gets its own
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    ts = tok.timestamp_begin
    said = [" Ten of clubs.", " Four queen.", " Seven of hearts."]
    spoken = [tok.encode(text) for text in said]
    text = [t for words in spoken for t in words]
    when = [k + 0.2 + 0.6 * i / (len(words) - 1) for k, words in enumerate(spoken) for i in range(len(words))]

    def attention(model: Any, tokenizer: Any, text_tokens: list[int], features: Any, frames: int) -> np.ndarray:
        assert text_tokens == text and frames == 300
        column = np.arange(frames // 2)[None, :]
        return -np.abs(column - np.array([*when, 3.0])[:, None] * 50)  # each token at its time, then the end

    monkeypatch.setattr("audio.word_alignment.attention_matrix", attention)
    events: list[SessionEvent] = []
    scheduler = Aligning([[ts, *text, ts + 150], [ts + 150, 1000, ts + 200]])
    live = LiveTranscription(TranscribeOptions(), LiveConfig(first_commit_s=0.0, tokens_per_second=1.0), scheduler,
                             events.append)  # type: ignore[arg-type]
    await live.start(tiny_whisper)
    for k in range(3):  # three utterances arrive before the pump gets to run
        live.add_speech(speech(1.0), k * 3 * SR)
        live.add_pause()
    assert await run_due(live) == 1
    closed = [(e.item, e.text) for e in events if e.type == "utterance"]
    assert closed == [(k, tok.decode(words)) for k, words in enumerate(spoken)]
    assert scheduler.requests[0].keep_features and scheduler.aligned == 1
    for k, transcript in closed:  # the deltas add up to each item's transcript
        assert "".join(e.text for e in events if e.type == "committed" and e.item == k) == transcript
    # an utterance decoded alone (after the others, their text forced) is split by nothing: its decode keeps no
    # encoder output and aligns nothing
    live.add_speech(speech(1.0), 9 * SR)
    live.add_pause()
    assert await run_due(live) == 1
    assert not scheduler.requests[1].keep_features and scheduler.aligned == 1
    assert [e.text for e in events if e.type == "utterance"][3] == live._text([1000])


async def test_a_session_behind_never_decodes_across_a_client_commit(tiny_whisper: LoadedWhisper) -> None:
    from audio.decoding import tokenizer_for

    ts = tokenizer_for(tiny_whisper, "en", "transcribe").timestamp_begin
    # two VAD pauses, then two client commits (hard pauses), all pending: one decode finishes the first three
    # utterances, up to the first commit and split by timestamps; the fourth is decoded alone from that commit
    # (its audio is one item, as OpenAI's commit makes it), no earlier audio or text forced before it
    merged = [ts, 1000, ts + 50, ts + 50, 1002, ts + 100, ts + 100, 1004, ts + 150]
    live, scheduler, events = await live_text(tiny_whisper, [merged, [ts, 1006, ts + 50]], tokens_per_second=1.0)
    for k, hard in enumerate((False, False, True, True)):
        live.add_speech(speech(1.0), k * 2 * SR)
        live.add_pause(hard)
    assert await run_due(live) == 2
    assert [(len(r.audio), r.prefix) for r in scheduler.requests] == [(3 * SR, ()), (SR, ())]
    closed = [(e.item, e.text) for e in events if e.type == "utterance"]
    assert closed == [(k, live._text([1000 + 2 * k])) for k in range(4)]
    assert live.next_action(True) is None


async def test_options_asked_for_mid_utterance_begin_with_the_next_one_and_no_decode_crosses_to_it(
        tiny_whisper: LoadedWhisper) -> None:
    # a session's update while its speaker talks (LiveKit's update_options): the utterance being spoken keeps the
    # prompt it began with, the next one is decoded with the new, and a session behind merges no decode across them
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    ts, dashwood = tok.timestamp_begin, tuple(tok.encode(" Dashwood"))
    script = [[ts, 1000, ts + 50, ts + 50, 1002, ts + 100], [ts, 1004, ts + 50], [ts, 1006, ts + 50]]
    live, scheduler, events = await live_text(tiny_whisper, script, tokens_per_second=1.0)
    live.add_speech(speech(1.0), 0)
    live.retune(TranscribeOptions(prompt="Dashwood"))
    live.add_speech(speech(1.0), SR)
    live.add_pause()  # utterance 0 ends: the new prompt begins here
    live.add_speech(speech(1.0), 3 * SR)
    live.add_pause()
    assert await run_due(live) == 2  # two decodes, though one could hold both (a commit's rule)
    first, second = scheduler.requests
    assert (len(first.audio), first.prompt) == (2 * SR, ())
    # the new prompt alone: the earlier text, written without it, conditions no more ("Clov's" kept "Clov's")
    assert (len(second.audio), second.prompt, second.prefix) == (SR, dashwood, ())
    assert [e.text for e in events if e.type == "utterance"] == [live._text([1000, 1002]), live._text([1004])]
    live.retune(TranscribeOptions())  # between utterances: the next one begins without the prompt
    live.add_speech(speech(1.0), 5 * SR)
    live.add_pause()
    assert await run_due(live) == 1
    assert scheduler.requests[-1].prompt[:len(dashwood)] != dashwood and live.options.prompt is None


async def test_text_with_no_timestamps_goes_to_the_first_pending_utterance(tiny_whisper: LoadedWhisper) -> None:
    live, scheduler, events = await live_text(tiny_whisper, [[1000, 1002, 1004]], tokens_per_second=1.0)
    for k in range(3):
        live.add_speech(speech(1.0), k * 2 * SR)
        live.add_pause()
    assert await run_due(live) == 1
    closed = [(e.item, e.text) for e in events if e.type == "utterance"]
    assert closed == [(0, live.committed_text()), (1, ""), (2, "")]


async def test_a_session_behind_merges_no_more_than_the_decoder_can_write(tiny_whisper: LoadedWhisper) -> None:
    # at 10 tokens a second, the tiny model's 32 tokens (16 kept for the text) hold 1.6 s: one utterance a decode
    live, scheduler, events = await live_text(tiny_whisper, [[1000], [1002], [1004]])
    for k in range(3):
        live.add_speech(speech(1.0), k * 2 * SR)
        live.add_pause()
    assert await run_due(live) == 3
    # each decode ends at the next pause (earlier speech stays as context, its text forced as the prefix)
    assert [r.frames for r in scheduler.requests] == [100, 200, 300]


async def test_a_final_decode_that_stops_short_is_decoded_again_from_where_its_text_ended(
        tiny_whisper: LoadedWhisper) -> None:
    from audio.decoding import tokenizer_for

    ts = tokenizer_for(tiny_whisper, "en", "transcribe").timestamp_begin
    # the first decode's text ends at 1.0 s of 3 s of speech; the second covers the rest
    live, scheduler, events = await live_text(tiny_whisper, [[ts, 1000, 1002, ts + 50], [ts, 1004, ts + 100]])
    live.add_speech(speech(3.0), 0)
    live.add_pause()
    assert await run_due(live) == 2
    assert [r.frames for r in scheduler.requests] == [300, 200]
    closed = [(e.item, e.text) for e in events if e.type == "utterance"]
    assert closed == [(0, live.committed_text())] and live.committed_text() == live._text([1000, 1002, 1004])
    assert live.next_action(True) is None


async def test_a_stopped_short_tail_that_begins_the_utterance_again_is_committed_once(
        tiny_whisper: LoadedWhisper) -> None:
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    ts = tok.timestamp_begin
    # the final's text closes at 1.0 s of 3 s (tiny.en's coarse timestamps); the tail, decoded again over little
    # speech and conditioned on that text, restarts it (rt_manual_1x: "... seven of Hearts. Eight of spades.")
    said = tok.encode(" Eight of spades, four of clubs, seven of hearts.")
    live, scheduler, events = await live_text(tiny_whisper, [[ts, *said, ts + 50],
                                                             [ts, *tok.encode(" Eight of spades."), ts + 100]])
    live.add_speech(speech(3.0), 0)
    live.add_pause(hard=True)
    assert await run_due(live) == 2
    assert [(e.item, e.text) for e in events if e.type == "utterance"] == [(0, tok.decode(said))]


async def test_a_final_text_closed_past_the_audio_is_forced_as_ending_at_the_audio(
        tiny_whisper: LoadedWhisper) -> None:
    from audio.decoding import tokenizer_for

    ts = tokenizer_for(tiny_whisper, "en", "transcribe").timestamp_begin
    # 2 s of speech whose text Whisper closes at 10 s (the cut context's end): the next decode's forced prefix
    # closes it at 2 s, where the speech after it begins
    live, scheduler, events = await live_text(tiny_whisper, [[ts, 1000, ts + 500], [ts + 100, 1002, ts + 150]])
    live.add_speech(speech(2.0), 0)
    live.add_pause()
    await run_due(live)
    live.add_speech(speech(1.0), 3 * SR)
    live.add_pause()
    await run_due(live)
    assert [r.frames for r in scheduler.requests] == [200, 300]
    assert list(scheduler.requests[1].prefix) == [ts, 1000, ts + 100]


async def test_a_sentence_a_decode_writes_twice_is_committed_once(tiny_whisper: LoadedWhisper) -> None:
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    ts = tok.timestamp_begin
    said = tok.encode(" Ten of clubs.")
    live, scheduler, events = await live_text(tiny_whisper, [[ts, *said, ts + 100, ts + 100, *said, ts + 150]])
    live.add_speech(speech(3.0), 0)
    live.add_pause()
    await run_due(live)
    assert live.committed_text() == " Ten of clubs."
    assert [(e.item, e.text) for e in events if e.type == "utterance"] == [(0, " Ten of clubs.")]
    # the transcript's segments (from the decoder's prefix, which keeps the repeat) say what the text says
    transcript = live.transcript(3.0)
    assert transcript.text == " Ten of clubs." and [s.text for s in transcript.segments] == [" Ten of clubs."]
    assert [s.id for s in transcript.segments] == [0]


async def test_an_utterances_first_guess_comes_after_first_redecode_s(tiny_whisper: LoadedWhisper) -> None:
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    ts = tok.timestamp_begin
    hello, there = (tok.encode(" " + word)[0] for word in ("hello", "there"))
    live, scheduler, _ = await live_text(tiny_whisper, [[ts], [ts, hello], [hello, there, ts + 50], [ts, there]],
                                         redecode_s=1.0, first_redecode_s=0.5)
    live.add_speech(speech(0.4), 0)
    assert await run_due(live) == 0
    live.add_speech(speech(0.1), int(0.4 * SR))
    assert await run_due(live) == 1  # 0.5 s: a first guess, with no text
    live.add_speech(speech(0.5), int(0.5 * SR))
    assert await run_due(live) == 1  # still no text: the next guess after 0.5 s more
    assert live.tentative == " hello"
    live.add_speech(speech(0.5), SR)
    assert await run_due(live) == 0  # the utterance has text: guesses every redecode_s
    live.add_pause()
    assert await run_due(live) == 1
    assert live.committed_text() == " hello there" and live.tentative == ""
    live.add_speech(speech(0.5), int(1.5 * SR))
    assert await run_due(live) == 1  # the next utterance's first guess comes early again
    assert [len(r.audio) for r in scheduler.requests][:2] == [SR // 2, SR]


async def test_after_an_empty_first_guess_the_next_comes_after_retry_redecode_s(tiny_whisper: LoadedWhisper) -> None:
    # On this CPU an utterance's first guess at 0.75 s often has no word yet: waiting another 0.75 s for the next
    # made its first word 1.5-1.6 s late (the shared clips); after an empty guess the next comes 0.5 s later.
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    ts = tok.timestamp_begin
    hello, there = (tok.encode(" " + word)[0] for word in ("hello", "there"))
    live, scheduler, _ = await live_text(tiny_whisper, [[ts], [ts, hello], [hello, there, ts + 100], [ts, there]],
                                         redecode_s=1.0, first_redecode_s=0.75, retry_redecode_s=0.5)
    live.add_speech(speech(0.75), 0)
    assert await run_due(live) == 1  # 0.75 s: a first guess, with no text
    live.add_speech(speech(0.5), int(0.75 * SR))
    assert await run_due(live) == 1  # 0.5 s more, not 0.75: the next guess
    assert live.tentative == " hello"
    live.add_speech(speech(0.75), int(1.25 * SR))
    assert await run_due(live) == 0  # the utterance has text: guesses every redecode_s
    live.add_pause()
    assert await run_due(live) == 1
    live.add_speech(speech(0.5), 2 * SR)
    assert await run_due(live) == 0  # the next utterance starts afresh: its first guess after 0.75 s
    live.add_speech(speech(0.25), int(2.5 * SR))
    assert await run_due(live) == 1
    assert [len(r.audio) for r in scheduler.requests][:2] == [int(0.75 * SR), int(1.25 * SR)]


async def test_an_empty_guess_before_a_pause_does_not_hurry_the_next_utterance(tiny_whisper: LoadedWhisper) -> None:
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    ts = tok.timestamp_begin
    hello = tok.encode(" hello")[0]
    live, scheduler, _ = await live_text(tiny_whisper, [[ts], [ts, hello, ts + 50], [ts, hello]],
                                         redecode_s=1.0, first_redecode_s=0.75, retry_redecode_s=0.5)
    live.add_speech(speech(0.75), 0)
    assert await run_due(live) == 1  # a first guess, with no text
    live.add_speech(speech(0.25), int(0.75 * SR))
    live.add_pause()
    assert await run_due(live) == 1  # the final
    live.add_speech(speech(0.5), SR)
    assert await run_due(live) == 0  # a new utterance: its first guess after 0.75 s, not 0.5
    live.add_speech(speech(0.25), int(1.5 * SR))
    assert await run_due(live) == 1



async def test_an_empty_first_guess_over_earlier_text_is_guessed_again_at_once_alone(
        tiny_whisper: LoadedWhisper) -> None:
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    ts = tok.timestamp_begin
    hello, there = (tok.encode(" " + word)[0] for word in ("hello", "there"))
    # the final of "hello"; a guess that opens a segment after it and ends; the same audio without the context
    live, scheduler, _ = await live_text(tiny_whisper, [[ts, hello, ts + 25], [ts + 25], [ts, there], [ts]],
                                         first_redecode_s=0.75, retry_redecode_s=0.5)
    live.add_speech(speech(0.5), 0)
    live.add_pause()
    assert await run_due(live) == 1
    live.add_speech(speech(0.75), SR // 2)
    assert await run_due(live) == 2  # the empty guess over " hello", then one over this utterance alone
    first, again = scheduler.requests[1:3]
    assert first.prefix == (ts, hello, ts + 25) and len(first.audio) == int(1.25 * SR)
    assert again.prefix == () and len(again.audio) == int(0.75 * SR)
    assert live.tentative == " there" and live._tr.seek == 50
    segments = live.transcript(1.25).segments
    assert [(s.text, s.start, s.end) for s in segments] == [(" hello", 0.0, 0.5)]
    # an empty first guess with no earlier text waits for retry_redecode_s as before
    live2, scheduler2, _ = await live_text(tiny_whisper, [[ts + 25], [ts, there]],
                                           first_redecode_s=0.75, retry_redecode_s=0.5)
    live2.add_speech(speech(0.75), 0)
    assert await run_due(live2) == 1


async def test_a_looping_guess_ends_the_conditioning_on_earlier_text(tiny_whisper: LoadedWhisper) -> None:
    # As the seek loop does after text sampled hot: on this CPU a sentence after cards read aloud looped on more
    # cards for five guesses in a row, each conditioned on the cards.
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    ts = tok.timestamp_begin
    four, clubs, john = (tok.encode(" " + word)[0] for word in ("four", "clubs", "John"))
    scheduler = Scored([([ts, four, clubs, ts + 25], -0.2, 1.0), ([ts, four, four, four], -0.2, 3.0),
                        ([ts, john], -0.2, 1.0), ([ts, john], -0.2, 1.0)])
    live = LiveTranscription(TranscribeOptions(), LiveConfig(context="whole", trim_s=0.1), scheduler,  # type: ignore[arg-type]
                             lambda e: None)
    await live.start(tiny_whisper)
    live.add_speech(speech(0.5), 0)
    live.add_pause()
    assert await run_due(live) == 1
    assert live.committed_text() == " four clubs" and live._tr.seek == 50  # trimmed: the cards are the prompt
    live.add_speech(speech(1.0), SR // 2)
    assert await run_due(live) == 1  # a guess that loops: no guess
    assert live.tentative == ""
    live.add_speech(speech(0.5), int(1.5 * SR))
    assert await run_due(live) == 1
    prompts = [r.prompt for r in scheduler.requests[1:]]
    assert prompts[0] == (ts, four, clubs, ts + 25) and prompts[1] == ()
    assert live.tentative == " John"



async def test_the_clients_prompt_conditions_every_decode_also_after_a_looping_guess(tiny_whisper: LoadedWhisper) -> None:
    # dictate --prompt "Queen of Clubs. ..." and --vocabulary Clubs gave "Queen of Cloves": the first guess looped (or was
    # cancelled by the pause), its reset took the prompt with the earlier text, and every decode after had prompt 0.
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    ts = tok.timestamp_begin
    four, clubs, john = (tok.encode(" " + word)[0] for word in ("four", "clubs", "John"))
    initial = tuple(tok.encode(" Queen of Clubs."))
    scheduler = Scored([([ts, four, four, four], -0.2, 3.0), ([ts, four, clubs, ts + 25], -0.2, 1.0),
                        ([ts, four, four, four], -0.2, 3.0), ([ts, john], -0.2, 1.0)])
    live = LiveTranscription(TranscribeOptions(prompt="Queen of Clubs."), LiveConfig(context="whole", trim_s=0.1),
                             scheduler, lambda e: None)  # type: ignore[arg-type]
    await live.start(tiny_whisper)
    live.add_speech(speech(1.0), 0)
    assert await run_due(live) == 1  # the utterance's first guess loops: the conditioning resets
    live.add_pause()
    assert await run_due(live) == 1
    assert live.committed_text() == " four clubs"
    live.add_speech(speech(1.0), SR)
    assert await run_due(live) == 1  # loops again, after earlier text
    live.add_speech(speech(0.5), 2 * SR)
    assert await run_due(live) == 1
    prompts = [r.prompt for r in scheduler.requests]
    assert prompts[0] == initial and prompts[1] == initial  # the final after the looping first guess
    # the client's prompt, then the earlier text (closed at its pause, 1.0 s: its speech ran to there)
    assert prompts[2] == (*initial, ts, four, clubs, ts + 50)
    assert prompts[3] == initial  # reset again: the earlier text goes, the client's prompt stays
    # a file's seek loop stays Whisper's: after a reset the prompt is gone
    tr = live._tr
    assert tr is not None
    tr.carry_prompt = False
    assert tr.request(speech(1.0), 100).prompt == ()


class Timed(Scripted):
    """Scripted decodes that each take the given seconds of a fake clock (`now`)."""

    def __init__(self, continuations: list[list[int]], seconds: list[float]) -> None:
        super().__init__(continuations)
        self.seconds, self.now = seconds, 0.0

    async def decode(self, loaded: Any, request: WindowRequest, cancellation: Any = None) -> WindowResult:
        self.now += self.seconds.pop(0)
        return await super().decode(loaded, request, cancellation)


async def test_after_a_slow_decode_no_guess_runs_until_a_final_comes_back_sooner(tiny_whisper: LoadedWhisper) -> None:
    # 8 speakers on 2 cores fell 8-11 s behind, each session guessing over all its open audio again and again.
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    ts = tok.timestamp_begin
    hello, there = (tok.encode(" " + word)[0] for word in ("hello", "there"))
    for slow, due in ((2.0, 0), (None, 1)):
        script = [[ts, hello], [ts, hello, there], [ts, hello, there, ts + 50], [ts, hello]]
        scheduler = Timed(script, [2.5, 0.5, 0.5, 0.5])
        live = LiveTranscription(TranscribeOptions(), LiveConfig(guess_slow_s=slow), scheduler,  # type: ignore[arg-type]
                                 lambda e: None, clock=lambda: scheduler.now)
        await live.start(tiny_whisper)
        live.add_speech(speech(0.75), 0)
        assert await run_due(live) == 1  # a first guess, 2.5 s in the scheduler
        live.add_speech(speech(1.0), int(0.75 * SR))
        assert await run_due(live) == due, slow
        live.add_pause()
        assert await run_due(live) == 1  # the final, back in 0.5 s
        assert live.committed_text() == " hello there"
        live.add_speech(speech(0.75), int(1.75 * SR))
        assert await run_due(live) == 1  # guesses again


async def test_while_behind_a_long_utterance_still_gets_a_guess_every_few_seconds(tiny_whisper: LoadedWhisper) -> None:
    # 4 sessions beside a busy chat on 2 cores: one 25 s utterance without a pause showed nothing for 37 s.
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    ts = tok.timestamp_begin
    hello, there = (tok.encode(" " + word)[0] for word in ("hello", "there"))
    for every, due in ((5.0, 1), (None, 0)):
        scheduler = Timed([[ts, hello], [ts, hello, there], [ts, hello, there]], [2.5, 0.5, 0.5])
        live = LiveTranscription(TranscribeOptions(), LiveConfig(slow_redecode_s=every),
                                 scheduler, lambda e: None, clock=lambda: scheduler.now)  # type: ignore[arg-type]
        await live.start(tiny_whisper)
        live.add_speech(speech(0.75), 0)
        assert await run_due(live) == 1  # a first guess, 2.5 s in the scheduler: behind from here on
        live.add_speech(speech(4.0), int(0.75 * SR))
        assert await run_due(live) == 0  # 4 s of new speech: not yet
        live.add_speech(speech(1.0), int(4.75 * SR))
        assert await run_due(live) == due, every  # 5 s: one guess
        if due:
            assert live.tentative == " hello there" and scheduler.requests[-1].temperatures == (0.0,)
            live.add_speech(speech(1.0), int(5.75 * SR))
            assert await run_due(live) == 1  # that guess came back in 0.5 s: not behind any more, one a second


class Blocking(Scripted):
    """Scripted decodes; once `block` is set, a decode waits until it is cancelled."""

    def __init__(self, continuations: list[list[int]]) -> None:
        super().__init__(continuations)
        self.block, self.started = False, anyio.Event()

    async def decode(self, loaded: Any, request: WindowRequest, cancellation: Any = None) -> WindowResult:
        if self.block:
            self.started.set()
            await anyio.sleep_forever()
        return await super().decode(loaded, request, cancellation)


async def test_a_cancelled_guess_shows_nothing_and_ends_the_conditioning(tiny_whisper: LoadedWhisper) -> None:
    # A pause that closes the utterance cancels its guess in flight: nothing an earlier looping guess left may show,
    # and, as after a loop, the earlier text no longer conditions the next decode (keeping it raised the 4x
    # real-time WER from 0.087 to 0.115).
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    ts = tok.timestamp_begin
    hello = tok.encode(" hello")[0]
    scheduler = Blocking([[ts, hello, ts + 25]])
    live = LiveTranscription(TranscribeOptions(), LiveConfig(trim_s=0.1), scheduler,  # type: ignore[arg-type]
                             lambda e: None)
    await live.start(tiny_whisper)
    live.add_speech(speech(0.5), 0)
    live.add_pause()
    assert await run_due(live) == 1  # the final of " hello", trimmed: now the prompt
    live._loop_head = [hello]  # what a looping guess left behind
    live.add_speech(speech(0.75), SR // 2)
    reset = live._tr.prompt_reset_since
    action = live.next_action(False)
    assert action is not None
    scheduler.block = True
    async with anyio.create_task_group() as tg:
        tg.start_soon(action)
        await scheduler.started.wait()
        live.add_pause()
        live.drop_closed_probe()
    assert live.tentative == "" and live.committed_text() == " hello"
    assert live._tr.prompt_reset_since > reset


async def test_a_looping_first_guess_shows_its_head_unless_it_copies_its_context(tiny_whisper: LoadedWhisper) -> None:
    # " 5, 5. 5, 5. …" over earlier cards is what was said ("five five"): one copy shows while the guess over the
    # utterance alone runs; after " 5, 5." the same loop copies the text that conditioned it and shows nothing; a
    # loop after other words shows the words before it.
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    ts = tok.timestamp_begin
    four, clubs, ten, of, hats = (tok.encode(" " + word)[0] for word in ("four", "clubs", "ten", "of", "hats"))
    five, dot, comma = tok.encode(" 5")[0], tok.encode(".")[0], tok.encode(",")[0]
    fives = [ts] + [five, comma, five, dot] * 4
    hatted = [ts, ten, of] + [hats] * 8  # what Whisper wrote for "ten of clubs" over earlier cards (another word)
    for said, loop, shown in (([four, clubs], fives, " 5, 5."), ([five, comma, five, dot], fives, ""),
                              ([four, clubs], hatted, " ten of")):
        events: list[SessionEvent] = []
        scheduler = Scored([([ts, *said, ts + 25], -0.2, 1.0), (loop, -0.2, 3.0)])  # the second over 2.4: a loop
        live = LiveTranscription(TranscribeOptions(), LiveConfig(context="whole"), scheduler,  # type: ignore[arg-type]
                                 events.append)
        await live.start(tiny_whisper)
        live.add_speech(speech(0.5), 0)
        live.add_pause()
        assert await run_due(live) == 1
        live.add_speech(speech(0.75), SR // 2)
        action = live.next_action(False)
        assert action is not None
        await action()  # the conditioned first guess loops
        assert scheduler.requests[-1].prefix == (ts, *said, ts + 25)
        assert live.tentative == shown, said
        assert live._tr.seek == 50  # the earlier text finished: the next guess is over the utterance alone
        assert live.committed_text() == live._text(said)  # the head is never committed


async def test_a_session_commits_what_as_many_guesses_agree_on_as_its_options_ask(tiny_whisper: LoadedWhisper) -> None:
    # a Realtime session's delay "high": three guesses must agree (two, the default, committed " The" a guess sooner)
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    ts = tok.timestamp_begin
    w = {word: tok.encode(" " + word)[0] for word in ("The", "quick", "brown", "fox")}
    events: list[SessionEvent] = []
    scheduler = Scripted([[ts, w["The"], w["quick"]], [ts, w["The"], w["quick"], w["brown"]],
                          [ts, w["The"], w["quick"], w["brown"], w["fox"]]])
    live = LiveTranscription(TranscribeOptions(agreement=3), LiveConfig(first_commit_s=0.0),
                             scheduler, events.append)  # type: ignore[arg-type]
    await live.start(tiny_whisper)
    at = 0
    for seconds, committed in ((1.2, ""), (1.0, ""), (1.0, " The")):
        live.add_speech(speech(seconds), at)
        at += int(seconds * SR)
        assert await run_due(live) == 1
        assert live.committed_text() == committed
    assert live.tentative == " quick brown fox"


class Heard(Scripted):
    """Decodes that write each scripted text whole (it begins with the forced prefix, as a decoder's would)."""

    async def decode(self, loaded: Any, request: WindowRequest, cancellation: Any = None) -> WindowResult:
        self.requests.append(request)
        tokens = self.continuations.pop(0)
        assert tokens[:len(request.prefix)] == list(request.prefix)
        return WindowResult(RowResult(tokens, tokens[len(request.prefix):], "", -0.1, 0.01, 0.0, 1.0), "en")


async def test_an_utterances_first_commit_waits_for_first_commit_s_of_it(tiny_whisper: LoadedWhisper) -> None:
    # tiny.en's guesses of librivox-0870 at real time: from 1.75 s they left its first word out, two agreed, and
    # " Mr. John Dashwood" committed first was forced into every later decode: the item never had its "And"
    from audio.decoding import tokenizer_for

    tok = tokenizer_for(tiny_whisper, "en", "transcribe")
    guesses = [" and Mr. Chair.", " Mr. John Dashwood had", " Mr. John Dashwood had then lee",
               " Mr. John Dashwood had then leisure to consider how.",
               " And Mr. John Dashwood had then leisure to consider how much",
               " And Mr. John Dashwood had then leisure to consider how much there might"]
    script = [[tok.timestamp_begin, *tok.encode(text)] for text in guesses]
    for first_commit_s, agreement, guess, first in ((5.0, 2, 6, " And Mr. John Dashwood"),
                                                    (0.0, 2, 3, " Mr. John Dashwood"),
                                                    (5.0, 1, 1, " and Mr.")):  # one to agree (delay "minimal"): no wait
        events: list[SessionEvent] = []
        live = LiveTranscription(TranscribeOptions(agreement=agreement), LiveConfig(first_commit_s=first_commit_s),
                                 Heard([list(s) for s in script]), events.append)  # type: ignore[arg-type]
        await live.start(tiny_whisper)
        at, guesses_run = 0, 0
        while not (committed := [e.text for e in events if e.type == "committed"]):
            seconds = 1.0 if at else 0.75  # a guess each: over 0.75, 1.75, ... 5.75 s of the utterance
            live.add_speech(speech(seconds), at)
            at += int(seconds * SR)
            guesses_run += await run_due(live)
        assert guesses_run == guess and committed[0].startswith(first), (first_commit_s, agreement, committed)
        if guess == 6:  # every guess was shown meanwhile, as before
            assert [e.text for e in events if e.type == "tentative"][:5] == guesses[:5]
