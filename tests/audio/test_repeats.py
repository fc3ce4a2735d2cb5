"""audio/repeats.py: text Whisper writes twice at a live decode's boundary is committed once."""

from __future__ import annotations

from audio.repeats import without_repeats, copies


def test_a_sentence_said_again_right_after_itself_is_dropped() -> None:
    assert without_repeats(" to be ill-disposed.", " Ten of clubs. Ten of clubs.") == " Ten of clubs."
    # a decode run again from an early timestamp: its first sentence is the last one committed
    assert without_repeats(" Four queen of clubs. Seven of clubs.", " Seven of clubs.") == ""
    # again and again, and a tail of the sentence before
    assert without_repeats("", " Five, five. Five, five. Five, five. Eight of spades.") == " Five, five. Eight of spades."
    assert without_repeats("", " He was not an ill-disposed young man. He was not an ill-disposed young man."
                               " Ill-disposed young man. Unless.") == " He was not an ill-disposed young man. Unless."


def test_a_sentence_begun_again_and_cut_short_is_dropped() -> None:
    # a final stopped short of the commit; its tail, decoded again over little speech, restarted the utterance
    before = " Eight of spades, four of Clothes, seven of Hearts."
    assert without_repeats(before, " Eight of spades.") == ""
    assert without_repeats(before, " Eight of spades. Ten of clubs.") == " Ten of clubs."
    assert without_repeats(before, " Eight of hearts.") == " Eight of hearts."  # not its start: speech
    assert without_repeats(" Ten of clubs, ten of hearts.", " Ten of.") == " Ten of."  # under 3 words


def test_a_sentence_started_again_a_few_words_back_loses_those_words() -> None:
    before = " And Mr. John Dashwood had then leisure to consider how much there might be."
    assert without_repeats(before, " Much there might be prudently in his power.") == " prudently in his power."


def test_what_is_kept_is_the_new_text_as_written_where_kept_spans_say() -> None:
    # The kept text is `new`'s own characters (whitespace too), so its tokens, cut where the spans are, join to it.
    from audio.repeats import kept_spans

    before = " And Mr. John Dashwood had then leisure to consider how much there might be."
    for new in (" Much there might be  prudently given ", " Much there might be prudently.  Ten of clubs."):
        kept = without_repeats(before, new)
        assert kept.startswith(" prudently") and kept == "".join(new[a:b] for a, b in kept_spans(before, new))
    assert without_repeats(before, " Much there might be  prudently given ") == " prudently given "  # its end too


def test_speech_that_only_looks_alike_is_kept() -> None:
    # one repeated word may be speech; a sentence begun before is not a repeat; different sentences stay
    assert without_repeats(" Five.", " Five.") == " Five."
    assert without_repeats(" Unless to be", " to be.") == " to be."
    assert without_repeats(" Ten of clubs.", " Ten of spades. Ten of hearts.") == " Ten of spades. Ten of hearts."
    assert without_repeats(" Ten of clubs.", " Of clubs and") == " Of clubs and"  # not a complete sentence
    assert without_repeats(" It was red.", " Red and blue.") == " Red and blue."  # fewer than 3 words shared
    assert without_repeats("", "") == ""


def test_a_live_transcripts_segments_are_held_as_the_committed_text_holds_them() -> None:
    from audio.repeats import as_committed

    # a segment that only repeats goes; one that holds a repeat loses it; a repeat the text kept (across
    # utterances) stays; segments the text does not go on with are kept as they are
    assert as_committed([" Ten of clubs.", " Ten of clubs.", " Four queen."], " Ten of clubs. Four queen.") == [
        " Ten of clubs.", "", " Four queen."]
    assert as_committed([" He was a man. He was a man.", " Unless."], " He was a man. Unless.") == [
        " He was a man.", " Unless."]
    assert as_committed([" Seven of clubs.", " Seven of clubs."], " Seven of clubs. Seven of clubs.") == [
        " Seven of clubs.", " Seven of clubs."]
    assert as_committed([" a b", " c d."], " other") == [" a b", " c d."]


def test_copies_finds_text_whose_words_run_in_the_context() -> None:
    cards = " 4 of clubs. 7 of hearts. 10 of clubs, 7 of clubs."
    assert copies(" 10 of clubs 7 of clubs", cards)  # case and punctuation aside
    assert copies(" Seven of Hearts", " seven of hearts")
    assert not copies(" 5, 5.", cards)
    assert not copies(" clubs 4", cards)  # the words, in their order
    assert not copies(" ...", cards) and not copies(" 5", "")


def test_copied_words_is_the_longest_run_the_context_holds_in_order() -> None:
    from audio.repeats import copied_words

    context = "He was not an ill-disposed young man. Unless to be rather cold-hearted"
    assert copied_words("rather cold-hearted. He was not an ill-disposed young man.", context) == 7  # "illdisposed"
    assert copied_words("Ten of clubs.", context) == 0
    assert copied_words("man unless", context) == 2 and copied_words("", context) == 0
