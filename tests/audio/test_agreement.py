"""audio/agreement.py: LocalAgreement-n over tokens — committed text only grows, is cut at word starts, and
the tentative rest never holds committed tokens; as many decodes agree as asked; complete segments are found and
shifted."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from audio.agreement import LiveText, common_prefix, last_boundary

TS = 100  # timestamp_begin of the fake vocabulary
EOT = 90


class Words:
    """Even tokens below EOT start a word (" a"), odd ones continue it ("b"); >= TS are timestamps."""

    eot = EOT
    timestamp_begin = TS

    def decode(self, tokens: list[int]) -> str:
        return "".join(("<ts>" if t >= TS else f" w{t}" if t % 2 == 0 else f"-{t}") for t in tokens)


def test_common_prefix_treats_any_two_timestamps_as_equal() -> None:
    assert common_prefix([TS, 2, 4, TS + 50], [TS + 3, 2, 4, TS + 7, 6], TS) == 4
    assert common_prefix([2, 4, 6], [2, 5, 6], TS) == 1
    assert common_prefix([], [2], TS) == 0


def test_last_boundary_finds_complete_segments() -> None:
    assert last_boundary([TS, 2, 4, TS + 20, TS + 20, 6], TS) == 4  # a pair: tokens[:4] is complete
    assert last_boundary([TS, 2, TS + 9, TS + 9, 4, TS + 30], TS) == 6  # closed after text: all complete
    assert last_boundary([TS, 2, 4], TS) == 0
    assert last_boundary([], TS) == 0


def test_agreement_commits_only_what_two_decodes_share_up_to_a_word_start() -> None:
    live = LiveText(Words())
    assert live.agree([TS, 2, 3, 4]) == 0  # the first hypothesis alone commits nothing
    assert live.previous == [TS, 2, 3, 4]
    # shared: TS, 2, 3, 4; the next tokens (4 vs 6...) — 4 is shared, then 5 continues the word "4-5"
    n = live.agree([TS, 2, 3, 4, 5, 6])
    assert n == 3 and live.prefix == [TS, 2, 3]  # " w2-3" is complete: the next token (4) starts a word
    assert live.previous == [4, 5, 6]
    # hypotheses are continuations after the prefix from here on
    assert live.agree([4, 5, 8]) == 2 and live.prefix == [TS, 2, 3, 4, 5] and live.previous == [8]


def test_agreed_text_that_is_all_the_newer_decode_wrote_keeps_its_last_word_tentative() -> None:
    # two guesses both ending " w2 w4-5" (a sentence end at the audio's edge): " w4-5" waits for a decode that
    # writes on after it, and that decode commits it
    live = LiveText(Words())
    assert live.agree([TS, 2, 4, 5, TS + 30]) == 0
    assert live.agree([TS, 2, 4, 5, TS + 30]) == 2 and live.prefix == [TS, 2] and live.previous == [4, 5, TS + 30]
    assert live.agree([4, 5, 6, TS + 40]) == 2 and live.prefix == [TS, 2, 4, 5] and live.previous == [6, TS + 40]
    # with only its first word agreed and nothing after it, nothing is committed
    live = LiveText(Words())
    live.agree([2, 3])
    assert live.agree([2, 3]) == 0 and live.prefix == []


def test_as_many_decodes_as_asked_must_agree() -> None:
    # three: two alike commit nothing, the third commits what all three share (a Realtime session's delay "high")
    live = LiveText(Words())
    assert live.agree([TS, 2, 4, 6, 8], need=3) == 0
    assert live.agree([TS, 2, 4, 6, 8], need=3) == 0
    assert live.agree([TS, 2, 4, 6, 10], need=3) == 4 and live.prefix == [TS, 2, 4, 6]
    assert live.history == [[8], [8], [10]]
    assert live.agree([8, 12], need=3) == 0  # " w8" is in two of the last three, not in " w10"
    # one ("minimal"): each decode's words but its last, which may be cut at the audio's edge
    live = LiveText(Words())
    assert live.agree([TS, 2, 4, 5, 6], need=1) == 4 and live.prefix == [TS, 2, 4, 5]
    assert live.agree([6, 8, TS + 30], need=1) == 1 and live.prefix == [TS, 2, 4, 5, 6]  # " w8." waits
    # fewer asked later: the newest decodes decide
    live = LiveText(Words())
    for hyp in ([2, 4], [6, 8], [6, 8, 10]):
        live.agree(hyp, need=4)
    assert live.prefix == [] and live.agree([6, 8, 10, 12], need=2) == 2 and live.prefix == [6, 8]


def test_trim_drops_finished_tokens_and_shifts_timestamps() -> None:
    live = LiveText(Words())
    live.prefix, live.previous = [TS, 2, TS + 40, TS + 40, 4], [6, TS + 60]
    live.trim(3, 40)
    assert live.prefix == [TS, 4] and live.previous == [6, TS + 20]
    live.reset()
    assert live.prefix == [] and live.previous is None


tokens = st.lists(st.sampled_from([2, 3, 4, 5, 6, 7, TS, TS + 5, TS + 9]), max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.lists(tokens, min_size=1, max_size=8), st.integers(1, 4))
def test_committed_only_grows_and_tentative_never_repeats_it(hypotheses: list[list[int]], need: int) -> None:
    live = LiveText(Words())
    committed: list[int] = []
    for hyp in hypotheses:
        n = live.agree(hyp, need)
        assert live.prefix == committed + hyp[:n]  # what was committed is still there, unchanged
        committed = list(live.prefix)
        assert live.previous == hyp[n:]  # the tentative rest starts after the committed tokens
        if n:
            assert n == len(hyp) or live.starts_word(hyp[n])
