"""audio/utterances.py: which pending utterance a decode's text belongs to."""

from __future__ import annotations

from audio.live_config import SessionEvent
from audio.utterances import Utterances, by_utterance, by_word

TS = 50000  # timestamp_begin; a timestamp counts UNIT samples
UNIT = 320
SR = 16000


def at(seconds: float) -> int:
    return TS + round(seconds * 16000 / UNIT)


def test_each_segment_goes_to_the_pause_after_its_middle() -> None:
    tokens = [at(0), 1, 2, at(1.0), at(1.2), 3, at(2.0), at(2.1), 4, 5, at(3.0)]
    groups = by_utterance(tokens, 0, TS, UNIT, 0, [16000 * 1.1, 16000 * 2.05, 16000 * 3])
    assert [[t for t in g if t < TS] for g in groups] == [[1, 2], [3], [4, 5]]


def test_only_tokens_after_the_forced_prefix_are_grouped_and_the_seek_shifts_times() -> None:
    tokens = [at(0), 1, at(1.0), at(1.0), 2, at(2.0), at(2.0), 3, at(3.0)]
    seek = 16000 * 10
    groups = by_utterance(tokens, 3, TS, UNIT, seek, [seek + 16000 * 1.5, seek + 16000 * 3])
    assert [[t for t in g if t < TS] for g in groups] == [[2], [3]]


def test_a_segment_never_goes_back_to_an_earlier_pause() -> None:
    # Whisper's second timestamp pair goes back in time: its text still follows the first segment's
    tokens = [at(2.0), 1, at(2.5), at(0.2), 2, at(0.4)]
    groups = by_utterance(tokens, 0, TS, UNIT, 0, [16000 * 1, 16000 * 3])
    assert [[t for t in g if t < TS] for g in groups] == [[], [1, 2]]


def test_an_unclosed_last_segment_goes_by_its_start_and_text_without_timestamps_to_the_first() -> None:
    groups = by_utterance([at(0), 1, at(1), at(1.6), 2, 3], 0, TS, UNIT, 0, [16000 * 1.5, 16000 * 3])
    assert [[t for t in g if t < TS] for g in groups] == [[1], [2, 3]]
    assert by_utterance([1, 2, 3], 0, TS, UNIT, 0, [100, 200]) == [[1, 2, 3], []]


def test_by_word_each_token_goes_to_the_pause_after_where_it_was_said() -> None:
    # one segment over three utterances (by_utterance gives it all to the middle one): its words' times split it;
    # a timestamp goes with the token after it, the last one with the last group
    tokens = [at(0), 1, 2, 3, 4, 5, at(3.0)]
    times: list[float | None] = [None, 0.5 * SR, 0.9 * SR, 1.5 * SR, 2.5 * SR, 2.6 * SR, None]
    pauses = [SR * 1.0, SR * 2.0, SR * 3.0]
    assert [[t for t in g if t < TS] for g in by_utterance(tokens, 0, TS, UNIT, 0, pauses)] == [[], [1, 2, 3, 4, 5], []]
    assert by_word(tokens, 0, times, pauses) == [[at(0), 1, 2], [3], [4, 5, at(3.0)]]
    # only the tokens after the forced prefix are grouped; a word said before an earlier one's utterance (a poor
    # alignment) stays with the earlier one, and one said past the last pause goes to the last
    assert by_word(tokens, 2, times, pauses) == [[2], [3], [4, 5, at(3.0)]]
    assert by_word([1, 2, 3], 0, [2.5 * SR, 0.5 * SR, 9.0 * SR], pauses) == [[], [], [1, 2, 3]]


def test_a_decode_reaches_the_pauses_it_can_hold_but_never_past_a_clients_commit() -> None:
    events: list[SessionEvent] = []
    u = Utterances(events.append)
    for at, hard in ((100, False), (200, True), (300, False)):
        u.pause(at, hard)
    assert u.reach(250) == 200 and u.reach(1000) == 200  # the commit ends it, however far the decode could go
    assert u.reach(150) == 100 and u.reach(50) == 100  # at least the first pause
    assert u.hard_at(200) and not u.hard_at(100) and not u.hard_at(150)
    u.close(2)
    assert u.reach(1000) == 300 and not u.hard_at(200) and list(u.hard) == [False]


def test_an_utterance_names_the_language_its_text_was_decoded_in() -> None:
    # the transcription's language when it closes (LiveTranscription.language): Realtime's `languages` reads it
    events: list[SessionEvent] = []
    language = ["en"]
    u = Utterances(events.append, lambda: language[0])
    u.pause(100)
    u.add(" Hello", None)
    u.close(1)
    language[0] = "jw"
    u.pause(200)
    u.close(1)
    assert [(e.text, e.language) for e in events if e.type == "utterance"] == [(" Hello", "en"), ("", "jw")]
