"""Which of a reply's sampled tokens wrote its message text: the Responses API gives log probabilities on
`output_text` alone (`include: ["message.output_text.logprobs"]`), not on the thinking or a call's arguments, which
chat's `logprobs` carry beside whatever chunk goes out.

The engine hands each token's log probability over with the delta whose text completes it (engine/step.py), so the
tokens read with a piece of text are that text's; the reply's splitter turns the text into deltas of one kind or
another, and the content's tokens are those whose bytes cover the content's, at the end of the text it came from
(thinking or a marker before it) or at its start (a call after it).
"""

from __future__ import annotations

from typing import Sequence

from engine.contracts import TokenLogprob
from engine.token_pieces import TokenPieces
from service.chat.replies import ChoiceDelta

__all__ = ["TextTokens"]


class TextTokens:
    """One reply's tokens sorted onto its content deltas, feed by feed."""

    def __init__(self, pieces: TokenPieces) -> None:
        self._pieces = pieces
        self._held: list[TokenLogprob] = []  # tokens of text the splitter holds back (a possible marker)

    def split(self, tokens: Sequence[TokenLogprob], deltas: Sequence[ChoiceDelta]) -> list[list[TokenLogprob]]:
        """For each of `deltas` (what one piece of text became) the tokens of its content: all of them on the
        feed's first content delta, none on the others. `tokens`: those read with the text. Raises nothing."""
        tokens = [*self._held, *tokens]
        out: list[list[TokenLogprob]] = [[] for _ in deltas]
        if not deltas:  # the text is held back: its tokens go with whatever it turns out to be
            self._held = tokens
            return out
        self._held = []
        content = [i for i, delta in enumerate(deltas) if delta.content]
        if not content:
            return out  # thinking, a marker or a call: no output_text
        size = sum(len((deltas[i].content or "").encode()) for i in content)
        from_end = bool(deltas[-1].content)
        taken: list[TokenLogprob] = []
        written = 0
        for token in reversed(tokens) if from_end else tokens:
            if written >= size:
                break
            taken.append(token)
            written += len(self._pieces.bytes(token.token))
        out[content[0]] = taken[::-1] if from_end else taken
        return out
