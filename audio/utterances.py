"""Utterances — where a live session's utterances end and which of them are closed.

Utterances are numbered from 0 (`item` in every event): the audio between two pauses is one utterance, and
every pause closes exactly one — with an `utterance` event carrying its text, empty when it had none. Text is
attributed to the oldest utterance not yet closed; a session behind decodes several at once, and
`by_word` splits that decode's text among them by where its words were said (audio/word_alignment.py;
`by_utterance`, by its segments' timestamps, where the words could not be aligned) — never across a client's commit
(a hard pause): that audio is one item, transcribed on its own, as OpenAI's commit makes it. Options asked for
mid-session (`ask`) wait for the first utterance that begins after them; no decode crosses the pause where they
begin.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from audio.live_config import SessionEvent
from audio.token_logprobs import TokenLogprob
from audio.transcript import TranscribeOptions

__all__ = ["Utterances", "by_utterance", "by_word"]


class Utterances:
    """Pauses not yet closed (compact positions), the utterance counts and the oldest open one's committed text.
    Not thread-safe; event loop only."""

    def __init__(self, emit: Callable[[SessionEvent], None],
                 language: Callable[[], str | None] = lambda: None) -> None:
        self._emit, self._language = emit, language  # `language`: the one the decodes are in now (an utterance's)
        self.pauses: deque[int] = deque()  # compact positions where an utterance ended, not yet closed
        self.hard: deque[bool] = deque()  # for each of `pauses`: a client's commit, which no decode crosses
        self.opened = 0  # utterances whose audio ended (pauses added); the open one's index
        self.closed = 0  # utterances transcribed and closed; the oldest open one's index
        self.open_from = 0  # compact position where the open utterance began
        self.text: list[str] = []  # committed text of the oldest utterance not yet closed
        self.logprobs: list[TokenLogprob] | None = []  # its tokens' log probabilities (None: not known for all)
        # options asked for, each with the compact position of the utterance it begins with (None: the open one's end)
        self._asked: deque[tuple[int | None, TranscribeOptions]] = deque()

    def pause(self, at: int, hard: bool = False) -> int:
        """The open utterance ended at `at` (even an empty one; `hard`: a client's commit, or where options asked
        for begin). Returns its index. Raises nothing."""
        self.pauses.append(at)
        self.hard.append(hard)
        self.opened += 1
        self.reopen(at)
        return self.opened - 1

    def reopen(self, at: int) -> None:
        """The open utterance begins (again) at `at`: options waiting for it begin there, and a pause pending there
        becomes hard. Raises nothing."""
        self.open_from = at
        if any(where is None for where, _ in self._asked):
            self._asked = deque((at if where is None else where, o) for where, o in self._asked)
            if self.pauses and self.pauses[-1] == at:
                self.hard[-1] = True

    def ask(self, options: TranscribeOptions, open_audio: bool) -> None:
        """Decode the utterances that begin from here with `options`: from the open one's end while it has
        `open_audio`, else from the next one, whose start a pause still pending becomes hard. Raises nothing."""
        self._asked.append((None if open_audio else self.open_from, options))
        if not open_audio and self.pauses and self.pauses[-1] == self.open_from:
            self.hard[-1] = True

    def options_due(self) -> tuple[int, TranscribeOptions] | None:
        """The next options asked for, with where they begin, once every utterance before them is closed (taken off
        the queue); else None. Raises nothing."""
        if not self._asked or (at := self._asked[0][0]) is None or (self.pauses and self.pauses[0] <= at):
            return None
        return at, self._asked.popleft()[1]

    @property
    def open_text(self) -> bool:
        """Committed text belongs to the open utterance (none is behind it). Raises nothing."""
        return not self.pauses and bool(self.text)

    def add(self, text: str, logprobs: tuple[TokenLogprob, ...] | None) -> None:
        """Committed `text` of the oldest open utterance, with its tokens' log probabilities (None: not known).
        Raises nothing."""
        self.text.append(text)
        if logprobs is None or self.logprobs is None:
            self.logprobs = None
        else:
            self.logprobs.extend(logprobs)

    def close(self, count: int) -> None:
        """The `count` oldest pauses are done: their utterances close, the first with the text so far."""
        for _ in range(count):
            self.pauses.popleft()
            self.hard.popleft()
            text, logprobs = "".join(self.text), self.logprobs
            self.text, self.logprobs = [], []
            self._emit(SessionEvent("utterance", text=text, item=self.closed, language=self._language(),
                                    logprobs=tuple(logprobs) if logprobs is not None else None))
            self.closed += 1

    def commit_by_pause(self, tokens: list[int], first: int, timestamp_begin: int, unit: int, seek: int, limit: int,
                        commit: Callable[[list[int]], None], times: list[float | None] | None = None) -> None:
        """Commit `tokens[first:]` (a decode from `seek` through `limit`) utterance by utterance: by_word's groups
        over the pauses up to `limit` where `times` (one for each of `tokens`) tells where its words were said,
        else by_utterance's; the utterances before a group closed first. Raises what `commit` raises."""
        pauses = [p for p in self.pauses if p <= limit] or [limit]
        groups = by_word(tokens, first, times, pauses) if times is not None else \
            by_utterance(tokens, first, timestamp_begin, unit, seek, pauses)
        done = 0
        for i, group in enumerate(groups):
            if group and i > done:
                self.close(i - done)
                done = i
            commit(group)

    def reach(self, end: float) -> int:
        """The furthest pending pause (at least the first) a decode from the seek may end at: at or before `end`,
        and never past a hard one. Merged across a commit, Whisper wrote one segment over both items and the
        first completed as ''. Raises IndexError with no pause pending."""
        last = self.pauses[0]
        for p, hard in zip(self.pauses, self.hard):
            if p > end:
                break
            last = p
            if hard:
                break
        return last

    def hard_at(self, at: int) -> bool:
        """Whether a client's commit is pending at `at`. Raises nothing."""
        return any(p == at and hard for p, hard in zip(self.pauses, self.hard))

    def close_through(self, limit: int) -> None:
        """Close the utterances whose pauses are at or before `limit`. Raises nothing."""
        self.close(sum(1 for p in self.pauses if p <= limit))


def by_utterance(tokens: list[int], first: int, timestamp_begin: int, unit: int, seek: int,
                 pauses: list[int]) -> list[list[int]]:
    """`tokens[first:]` (a decode from compact sample `seek`, timestamp tokens from `timestamp_begin` counting
    `unit` samples each) in one group a pause of `pauses` (ascending compact positions, at least one): a
    segment goes to the first pause after its middle, never to one before an earlier segment's. Text with no
    timestamp around it stays with the group before it (all of it in the first when none has any). Raises
    nothing."""
    groups: list[list[int]] = [[] for _ in pauses]
    k = 0
    start: int | None = None  # the timestamp that opened the current segment
    held: list[int] = []  # the current segment's tokens at or after `first`, until its end places them
    text = False  # the current segment has text

    def place(end: int | None) -> None:
        nonlocal k
        if start is not None:
            middle = seek + (start + (end if end is not None else start)) * unit / 2
            while k < len(pauses) - 1 and middle > pauses[k]:
                k += 1
        groups[k].extend(held)
        held.clear()

    for i, t in enumerate(tokens):
        if t >= timestamp_begin:
            if text:  # closes the segment
                if i >= first:
                    held.append(t)
                place(t - timestamp_begin)
                start, text = None, False
                continue
            start = t - timestamp_begin  # opens one (a repeated timestamp opens it again)
        else:
            text = True
        if i >= first:
            held.append(t)
    place(None)
    return groups


def by_word(tokens: list[int], first: int, times: list[float | None], pauses: list[int]) -> list[list[int]]:
    """`tokens[first:]` in one group a pause of `pauses` (ascending compact positions, at least one): a token
    with a time in `times` (one for each of `tokens`: audio/word_alignment.token_times) goes to the first pause at
    or after it, never to one before an earlier token's; one without (a timestamp) goes with the token after it,
    at the end with the last group. Raises nothing."""
    groups: list[list[int]] = [[] for _ in pauses]
    k = 0
    held: list[int] = []
    for t, at in zip(tokens[first:], times[first:]):
        held.append(t)
        if at is not None:
            while k < len(pauses) - 1 and at > pauses[k]:
                k += 1
            groups[k].extend(held)
            held.clear()
    groups[k].extend(held)
    return groups
