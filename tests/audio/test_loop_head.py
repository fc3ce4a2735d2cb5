"""What a looping guess may still show: the words before its loop, or one copy of a loop that starts its text,
unless those words copy the text that conditioned it."""

from __future__ import annotations

from audio.loop_head import loop_head

EOT = 100
WORDS = {1: " ten", 2: " of", 3: " hats", 4: " 5,", 5: " 5.", 6: " clubs"}


def text(tokens: list[int]) -> str:
    return "".join(WORDS.get(t, "") for t in tokens)


def test_the_words_before_a_loop_show() -> None:
    assert loop_head([1, 2, 3, 3, 3, 3], EOT, [], text) == [1, 2]


def test_a_loop_that_starts_the_text_shows_one_copy() -> None:
    assert loop_head([4, 5, 4, 5, 4, 5], EOT, [], text) == [4, 5]
    assert loop_head([EOT + 1, 4, 5, EOT + 7, 4, 5, 4, 5, EOT], EOT, [], text) == [4, 5]  # timestamps left out


def test_a_head_that_copies_its_conditioning_shows_nothing() -> None:
    assert loop_head([4, 5, 4, 5, 4, 5], EOT, [6, 4, 5, EOT + 3], text) is None
    assert loop_head([4, 5, 4, 5, 4, 5], EOT, [6, 1, 2], text) == [4, 5]


def test_text_that_does_not_loop_has_no_head() -> None:
    assert loop_head([1, 2, 6], EOT, [], text) is None
