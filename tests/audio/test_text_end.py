"""audio/text_end.py: where a final live decode's text ends when it stopped short of the speech."""

from __future__ import annotations

from audio.text_end import closed_at, stopped_short


def test_a_final_text_stopped_short_ends_at_its_closing_timestamp_or_before_its_open_segment() -> None:
    # A text ending on a timestamp is kept whole and ends there; after an open segment (text with no closing
    # timestamp) the text is known to end where that segment began: it is left out and decoded again from there,
    # never committed twice. Too near the limit or the seek, nothing is decoded again.
    begin, per = 50000, 640  # timestamp tokens from 50000; 0.04 s (640 samples) a timestamp step
    closed = [7, begin, 11, 12, begin + 50]  # <|0.00|> a b <|1.00|>
    assert stopped_short(closed, begin, per, 0, 10 * 16000) == (50 * per, len(closed))
    opened = closed + [begin + 50, 13, 14]  # ... <|1.00|> c d (no closing timestamp)
    assert stopped_short(opened, begin, per, 0, 10 * 16000) == (50 * per, len(closed) + 1)
    assert stopped_short(opened, begin, per, 16000 * 5, 16000 * 8) == (16000 * 5 + 50 * per, len(closed) + 1)
    assert stopped_short(closed, begin, per, 0, 50 * per + 16000 // 2) is None  # less than RETRY_TAIL_S left
    assert stopped_short([7, begin, 11], begin, per, 0, 10 * 16000) is None  # it ends at the seek itself
    assert stopped_short([7, 11], begin, per, 0, 10 * 16000) is None  # no timestamp at all
    # the sampled text (after a forced prefix) has no timestamp: where it ends is not known, and it is all kept
    assert stopped_short(closed + [13, 14], begin, per, 0, 10 * 16000, forced=len(closed)) is None


def test_sampled_timestamps_past_the_audio_are_clamped_to_its_end() -> None:
    # tiny.en closed a 4.8 s text at the cut context's end (10 s): forced as the next prefix, nothing more was written
    from audio.text_end import clamped_timestamps

    begin = 50000
    tokens = [begin, 7, begin + 500, begin + 500, 8, begin + 600]
    assert clamped_timestamps(tokens, begin, 240) == [begin, 7, begin + 240, begin + 240, 8, begin + 240]
    assert clamped_timestamps(tokens, begin, 240, forced=3) == tokens[:3] + [begin + 240, 8, begin + 240]
    assert clamped_timestamps([7, begin + 3], begin, 240) == [7, begin + 3]  # within the audio: unchanged


def test_a_final_text_closed_before_its_pause_is_closed_at_the_pause() -> None:
    # Whisper closed "5 5." at 37.32 s, its pause came at 38.1 s: the next decode read the tail again from 37.32 s.
    # Only a sampled closing timestamp after text moves, and never back; an open segment is left as it is.
    begin = 50000
    closed = [begin, 11, 12, begin + 50]
    assert closed_at(closed, begin, 60) == [begin, 11, 12, begin + 60]
    assert closed_at(closed, begin, 40) == closed  # already past it (clamped_timestamps caps it)
    assert closed_at(closed + [begin + 50, 13], begin, 60) == closed + [begin + 50, 13]
    assert closed_at(closed, begin, 60, forced=len(closed)) == closed  # forced: an earlier decode's
    assert closed_at([begin, begin + 10], begin, 60) == [begin, begin + 10]  # no text
    assert closed_at([], begin, 60) == []
