"""audio/token_logprobs.py: entries cut to the text an answer carries — the file routes' text, stripped at both ends,
keeps exactly its own bytes, each token its log probability."""

from __future__ import annotations

import pytest

from audio.token_logprobs import TokenLogprob, less_trailing, stripped_logprobs


def entries(*pieces: tuple[bytes, float]) -> tuple[TokenLogprob, ...]:
    return tuple(TokenLogprob(raw.decode(errors="replace"), lp, tuple(raw)) for raw, lp in pieces)


def joined(got: tuple[TokenLogprob, ...]) -> str:
    return bytes(b for e in got for b in e.bytes).decode()


def test_less_trailing_cuts_bytes_from_the_last_tokens_keeping_their_logprobs() -> None:
    said = entries((b" Yes", -0.1), (b". ", -0.2), (b" ", -0.3))
    assert less_trailing(said, 0) == said
    assert less_trailing(said, 1) == said[:2]  # a token wholly within goes
    assert less_trailing(said, 2) == (said[0], TokenLogprob(".", -0.2, tuple(b".")))  # the one they end in keeps
    assert less_trailing(said, 100) == ()


@pytest.mark.parametrize("text", [" Ten of clubs.", "Ten of clubs. ", "  Ten of clubs. \n", "Ten of clubs."])
def test_stripped_logprobs_join_to_the_stripped_text(text: str) -> None:
    raw = text.encode()
    said = entries((raw[:3], -0.1), (raw[3:9], -0.2), (raw[9:], -0.3))
    got = stripped_logprobs(said, text)
    assert joined(got) == text.strip()
    assert [e.logprob for e in got] == [-0.1, -0.2, -0.3]  # each token keeps some text, and its value


def test_stripped_logprobs_of_whitespace_alone_are_none() -> None:
    assert stripped_logprobs(entries((b" ", -0.1), (b" \n", -0.2)), "  \n") == ()
