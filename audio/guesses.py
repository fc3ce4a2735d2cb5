"""LiveGuesses — a live session's guesses (audio/live.py LiveTranscription builds on it): the open audio re-decoded as
it grows, what the last decodes agree on committed (audio/agreement.py), the rest shown as tentative text.

An utterance's first commit waits until a guess covers `first_commit_s` of it (LiveConfig): what is committed first is
forced at the start of every later decode, so a word a short decode left out before it is lost for good. tiny.en's
fitted decodes of 1.25–4.5 s of a LibriVox sentence all began "Mr. John Dashwood", two agreed, and its first word
("And", which every decode from 4.75 s on and the file route kept) was never written; its whole-window decodes left it
out at 2.5 and 3.5–3.75 s, so one of them confirming the first commit lost it too. Tentative text is shown as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import anyio

from audio.agreement import LiveText
from audio.decoding import WindowedTranscription
from audio.guess_cadence import GuessCadence
from audio.live_config import LiveConfig
from audio.pcm import SAMPLE_RATE
from audio.timeline import Timeline
from audio.token_logprobs import aligned_logprobs
from audio.utterances import Utterances
from audio.window import WindowResult

__all__ = ["LiveGuesses"]


class LiveGuesses:
    """The guess (`_probe`) and the cancelling of the one in flight, over LiveTranscription's state (set up by its
    __init__)."""

    config: LiveConfig
    agreement: int  # decodes that must agree before text is committed
    utterances: Utterances
    timeline: Timeline
    tentative: str
    _tr: WindowedTranscription | None
    _live: LiveText | None
    _cadence: GuessCadence
    _probed_at: int
    _final_to: int
    _probe_scope: anyio.CancelScope | None
    _loop_head: list[int] | None

    if TYPE_CHECKING:  # LiveTranscription's
        def _seek(self) -> int: ...
        async def _decode(self, count: int, probe: bool = False,
                          scope: "anyio.CancelScope | None" = None) -> WindowResult | None: ...
        def _clamped(self, tokens: list[int], seek: int, end: int, forced: int) -> list[int]: ...
        def _commit_text(self, tokens: list[int], logprobs: Sequence[float | None] | None = None) -> None: ...
        def _set_tentative(self, tokens: list[int]) -> None: ...
        def _trim(self, result: WindowResult, end: int) -> None: ...
        def _finish_all(self, limit: int) -> None: ...

    def drop_closed_probe(self) -> None:
        """Cancel the probe in flight once a pause has closed the utterance it decodes: the final decode due
        next gives all that text, so waiting for the probe only delays it. Raises nothing."""
        if self.utterances.pauses:
            self.cancel_probe()

    def cancel_probe(self) -> None:
        """Cancel the probe in flight, if any (its window leaves the scheduler before the next step). Raises
        nothing."""
        if self._probe_scope is not None:
            self._probe_scope.cancel()

    def _first_commit_waits(self, end: int) -> bool:
        """Whether a guess over the open audio up to `end` may commit nothing yet: the open utterance has no committed
        text and less than `first_commit_s` of audio. With one decode to agree (a Realtime `delay` of "minimal"), it
        never waits. Raises nothing."""
        u = self.utterances
        return self.agreement > 1 and not u.text and end - u.open_from < self.config.first_commit_s * SAMPLE_RATE

    async def _probe(self) -> None:
        """Re-decode the open audio; commit what agrees with the decodes before it. Cancelled (drop_closed_probe,
        cancel_probe) it shows and commits nothing, and ends the conditioning on earlier text as a looping guess does
        (kept: without it the 4x real-time WER of the shared clips rose from 0.087 to 0.115, bench/RESULTS.md)."""
        tr, live = self._tr, self._live
        assert tr is not None and live is not None
        end = self._probed_at = self.timeline.length
        seek = self._seek()
        result = None
        try:
            with anyio.CancelScope() as self._probe_scope:
                result = await self._decode(end - self._seek(), probe=True, scope=self._probe_scope)
        finally:
            self._probe_scope = None
        if result is None:
            # Sampled hot, a final's fallback would have reset the prompt (decoding.commit): so does a guess that
            # loops. After cards read aloud, a sentence's guesses looped on more cards five times over.
            tr.prompt_reset_since = len(tr.all_tokens)
            self._cadence.empty = True
            first = not self.utterances.text and not self.tentative
            self._guess_alone()
            if first and self._loop_head is not None:  # never committed; a guess alone, if one follows, replaces it
                self._set_tentative(self._loop_head)  # (first words had waited for the final: 2.0-3.3 s on this CPU)
            return
        if tr.silent(result) and not live.prefix:
            self._cadence.empty = True
            self._set_tentative([])
            return
        continuation = self._clamped(result.decoded.tokens[len(live.prefix):], seek, end, 0)
        n = 0 if self._first_commit_waits(end) else live.agreed(continuation, self.agreement)
        logprobs = aligned_logprobs(result.decoded.logprobs, len(live.prefix))
        committed = logprobs[len(live.prefix):][:n] if logprobs is not None else None
        live.take(continuation, n)
        self._commit_text(continuation[:n], committed)
        self._set_tentative(continuation[n:])
        self._cadence.empty = not self.tentative and not self.utterances.text
        if self._cadence.empty:
            self._guess_alone()
        self._trim(result, end)

    def _guess_alone(self) -> bool:
        """After an empty first guess over earlier utterances' text, finish that text and guess again at once
        over the open utterance alone: forced after 13 s of kept text, Whisper opened a segment and ended for four
        guesses in a row (a new sentence's first word 2.9 s late on this CPU); without it, at the next guess.
        Returns whether it did. Raises nothing."""
        live = self._live
        assert live is not None
        u = self.utterances
        if u.pauses or u.text or not live.prefix or not self._seek() < u.open_from <= self._final_to:
            return False
        self._finish_all(self.utterances.open_from)
        self._probed_at = self.utterances.open_from
        return True
