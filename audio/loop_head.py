"""What a live guess that loops may still show: its head. Two looping guesses would agree and commit the loop, so
a looping guess is no guess, but an utterance's first one still tells the first words — the text before the loop
(" Ten of" of " Ten of f***ing f***ing …") or one copy of a loop that starts the text (" 5, 5." of " 5, 5. 5, 5. …")
— unless those words run in the earlier text that conditioned it (" 10 of clubs 7 of clubs 7 of clubs …" over a
sentence after cards read aloud: what it read, not what it heard)."""

from __future__ import annotations

from typing import Callable

from audio.repeats import copies
from audio.window import loop_at

__all__ = ["loop_head"]


def loop_head(sampled: list[int], eot: int, conditioned_on: list[int],
              text: Callable[[list[int]], str]) -> list[int] | None:
    """The head of `sampled` (a guess's tokens; those from `eot` on, timestamps and specials, are left out) as the
    module says, or None when it does not loop or its head copies `conditioned_on` (the prompt and forced prefix).
    `text` renders tokens. Raises nothing."""
    words = [t for t in sampled if t < eot]
    at = loop_at(words)
    if at is None:
        return None
    head = words[:at[0]] if at[0] else words[:at[1]]
    return None if copies(text(head), text(conditioned_on)) else head
