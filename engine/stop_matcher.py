"""StopMatcher — one row's sampled tokens as text, and when the row stops.

Streaming detokenization through mlx-lm's detokenizers, or the tokenizer's own decode where mlx-lm has only its
generic one (never splits a UTF-8 character, and a character the reply's last tokens leave unfinished is no text: never
U+FFFD); special tokens and ids past the tokenizer's vocabulary write no text;
stop token ids, stop strings with hold-back, and max_tokens; vLLM's min_tokens (neither ends the row before it) and
ignore_eos (the model's end-of-sequence tokens do not end it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from mlx_lm.tokenizer_utils import NaiveStreamingDetokenizer

from engine.contracts import FinishReason
from engine.special_tokens import hidden_special_ids
from engine.token_pieces import token_pieces, unfinished_bytes

__all__ = ["StepText", "StopMatcher"]


@dataclass
class StepText:
    """What one sampled token turned into: text now safe to emit, and whether the row is done."""

    text: str
    finish_reason: FinishReason | None


class StopMatcher:
    """Incremental detokenization plus stop conditions for one row."""

    def __init__(self, tokenizer: Any, *, stop: Iterable[str] = (), stop_token_ids: Iterable[int] = (),
                 max_tokens: int, keep_leading_space: bool = False, skip_special_tokens: bool = True,
                 min_tokens: int = 0, ignore_eos: bool = False, continued: Sequence[int] = ()) -> None:
        """`keep_leading_space`: the reply continues its prompt (a text completion); `continued`: that prompt's
        tokens, whose unfinished last character the reply's first bytes finish. Raises what the tokenizer raises."""
        self._detok = tokenizer.detokenizer
        if isinstance(self._detok, NaiveStreamingDetokenizer):  # no tokenizer.json: a plain `decode` (see the class)
            self._detok = _ContextDetokenizer(tokenizer, getattr(self._detok, "_clean_spaces", True), keep_leading_space)
        else:
            _keep_leading_space(self._detok, keep_leading_space)
        if continued:
            _continue_after(self._detok, tokenizer, continued)
        self.stop_strings = [s for s in stop if s]
        eos = frozenset(getattr(tokenizer, "eos_token_ids", ()) or ())
        self.stop_ids = set(stop_token_ids) | (set() if ignore_eos else eos)
        # Special tokens written mid-reply are markup, not text (engine/special_tokens.py); they still count. So is an
        # end-of-sequence token that does not end the row (ignore_eos, or before min_tokens).
        self._hidden = hidden_special_ids(tokenizer) | eos if skip_special_tokens else frozenset()
        # vLLM's min_tokens: stop ids and strings end the row only from the token after this many.
        self.min_tokens = min_tokens
        self._quiet = 0  # pending text the first min_tokens tokens wrote: a stop string must end past it
        # Ids past the tokenizer's vocabulary (a vocab_size padded to a multiple of 64) have no text: mlx-lm's BPE
        # detokenizer wrote them as "!".
        self._text_vocab = _text_vocab(tokenizer)
        self.max_tokens = max_tokens
        self.generated = 0
        self._pending = ""  # decoded text not yet emitted (could be the start of a stop string)
        self.finish_reason: FinishReason | None = None
        # With stop strings: characters emitted so far, and where a stop string cut the text (None: it did not).
        self.shown = 0
        self._cut_at: int | None = None
        # The stop string that ended the row (Anthropic's `stop_sequence` names it); None: it ended otherwise.
        self.stopped_by: str | None = None

    def position(self) -> int:
        """Where the next token's text starts in the row's text (with stop strings; 0 without). Raises nothing."""
        if not self.stop_strings:
            return 0
        return self.shown + len(self._pending) + _held(self._detok)

    def shown_before(self) -> float:
        """Text before this position has been emitted (a token whose text ends by it was shown whole); everything
        when there are no stop strings or the row ended without a cut. Raises nothing."""
        if self._cut_at is not None:
            return self._cut_at
        if not self.stop_strings or self.finish_reason is not None:
            return float("inf")
        return self.shown

    def add(self, token: int, *, at_context_limit: bool = False) -> StepText:
        """Feed one sampled token. Raises RuntimeError if the row already finished."""
        if self.finish_reason is not None:
            raise RuntimeError("row already finished")
        self.generated += 1
        if token in self.stop_ids and self.generated > self.min_tokens:
            return self._finish("stop")
        if token in self._hidden or token >= self._text_vocab:
            if self.generated >= self.max_tokens or at_context_limit:
                return self._finish("length")
            return StepText("", None)
        self._detok.add_token(token)
        if not self.stop_strings:  # nothing to hold back: the common case, kept cheap (once per row per token)
            if self.generated >= self.max_tokens or at_context_limit:
                self._pending = self._detok.last_segment
                return self._finish("length")
            return StepText(self._detok.last_segment, None)
        self._pending += self._detok.last_segment
        if self.generated <= self.min_tokens:
            self._quiet = len(self._pending)
        cut = self._find_stop()
        if cut is not None:
            text, self._pending = self._pending[:cut], ""
            self.finish_reason = "stop"
            self.shown = self._cut_at = self.shown + cut
            return StepText(text, "stop")
        if self.generated >= self.max_tokens or at_context_limit:
            return self._finish("length")
        keep = self._holdback()
        text = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(text):]
        self._quiet = max(0, self._quiet - len(text))
        self.shown += len(text)
        return StepText(text, None)

    def _finish(self, reason: FinishReason) -> StepText:
        _drop_unfinished(self._detok)
        self._detok.finalize()
        self._pending += self._detok.last_segment
        if self.generated <= self.min_tokens:
            self._quiet = len(self._pending)
        cut = self._find_stop()
        if cut is not None:
            reason = "stop"
            text = self._pending[:cut]
            self._cut_at = self.shown + cut
        else:
            text = self._pending
        self.shown += len(text)
        self._pending = ""
        self._quiet = 0
        self.finish_reason = reason
        return StepText(text, reason)

    def _find_stop(self) -> int | None:
        """Where the earliest stop string starts in the pending text (None: none does), ending past the text of the
        first min_tokens tokens (vLLM's); that string is noted in `stopped_by`."""
        if not self.stop_strings:
            return None
        hits = [(i, s) for s in self.stop_strings
                if (i := self._pending.find(s, max(0, self._quiet - len(s) + 1))) >= 0]
        if not hits:
            return None
        cut, self.stopped_by = min(hits, key=lambda hit: hit[0])
        return cut

    def _holdback(self) -> int:
        """Length of the longest suffix of the pending text that could begin a stop string."""
        best = 0
        for s in self.stop_strings:
            for n in range(min(len(s) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(s[:n]):
                    best = n
                    break
        return best


def _keep_leading_space(detok: Any, continuation: bool) -> None:
    """Keep the space mlx-lm's detokenizers trim off a reply's first token, so its text matches its tokens (and
    their log probabilities): byte-level BPE's always (its space is a byte the model wrote, which the tokenizer's
    decode and vLLM keep: " World"); SentencePiece's in a continuation only (" 4" after "1, 2, 3,"), its decode
    dropping the "▁" a reply starts with otherwise. Raises nothing."""
    if hasattr(detok, "trim_space"):  # SentencePiece
        detok.trim_space = detok.trim_space and not continuation
    elif hasattr(detok, "_maybe_trim_space"):  # byte-level BPE: the instance's own method shadows the class's
        detok._maybe_trim_space = _as_written


def _as_written(text: str) -> str:
    return text


@functools.lru_cache(maxsize=1)
def _byte_encoder() -> dict[int, str]:
    """Each byte's character in byte-level BPE pieces (mlx-lm's table, reversed). Raises nothing."""
    from mlx_lm.tokenizer_utils import _byte_decoder

    return {byte: char for char, byte in _byte_decoder().items()}


def _continue_after(detok: Any, tokenizer: Any, prompt: Sequence[int]) -> None:
    """Start the detokenizer with the bytes of a character the prompt leaves unfinished (a token-id prompt may end
    mid-character): the reply's bytes that finish it write it whole, as a decode of prompt and reply together does.
    Raises what the tokenizer's `decode` raises."""
    tail, tokens = token_pieces(tokenizer).unfinished_tail(prompt)
    if not tail:
        return
    if isinstance(detok, _ContextDetokenizer):
        detok.continue_after(prompt[len(prompt) - tokens:])
    elif isinstance(getattr(detok, "_unflushed", None), str):  # byte-level BPE: a piece's character per byte
        encoder = _byte_encoder()
        detok._unflushed = "".join(encoder[b] for b in tail)
    elif isinstance(getattr(detok, "_unflushed", None), bytes):  # SentencePiece: the pieces' bytes
        detok._unflushed = tail


def _drop_unfinished(detok: Any) -> None:
    """Drop the bytes of a character the reply's last tokens began and never finished: `finalize` would write them
    as U+FFFD (which a stop string "\ufffd" then matched); vLLM's detokenizer never writes such a tail either.
    Their tokens' log probabilities still go (their bytes say what they were). _ContextDetokenizer drops its own.
    Raises nothing."""
    unflushed = getattr(detok, "_unflushed", None)
    if isinstance(unflushed, bytes):  # SentencePiece: the pieces' bytes
        detok._unflushed = unflushed[: len(unflushed) - unfinished_bytes(unflushed[-3:])]
    elif isinstance(unflushed, str) and unflushed:  # byte-level BPE: a character per byte (mlx-lm's table)
        from mlx_lm.tokenizer_utils import _byte_decoder

        decoder, last = _byte_decoder(), unflushed[-3:]
        if all(c in decoder for c in last):
            detok._unflushed = unflushed[: len(unflushed) - unfinished_bytes(bytes(decoder[c] for c in last))]


class _ContextDetokenizer:
    """Streams a tokenizer's own `decode` for checkpoints mlx-lm gives its NaiveStreamingDetokenizer (no
    tokenizer.json, e.g. a SentencePiece tokenizer.model alone). The tokens since the last emitted text are decoded
    after a context ("a"), whose text is cut off: `decode` drops a first piece's leading space, which the naive
    detokenizer then lost between lines, and its trimmed-then-restored trailing space came out twice."""

    def __init__(self, tokenizer: Any, clean_spaces: bool, keep_leading_space: bool) -> None:
        """`clean_spaces`: `decode` may drop a space before punctuation, so a trailing space waits for the next token.
        `keep_leading_space`: the first token's text starts after the context too. Raises what `decode` raises."""
        self._decode = tokenizer.decode
        self._clean_spaces = clean_spaces
        self._context: list[int] = list(tokenizer.encode("a", add_special_tokens=False))
        self._context_chars = len(self._decode(self._context))
        self._window = list(self._context) if keep_leading_space else []
        self._shown = self._context_chars if keep_leading_space else 0  # the window's text before this is emitted
        self._segment = ""
        self.held = 0  # whole characters decoded but not emitted (a space that cleaning up may drop)

    def add_token(self, token: int) -> None:
        self._window.append(token)
        text = self._decode(self._window)
        ready = text.rstrip("\ufffd")  # a partial UTF-8 character waits for its other bytes
        if self._clean_spaces and ready.endswith(" "):
            ready = ready[:-1]
        if len(ready) > self._shown:
            self._segment += ready[self._shown:]
            self._shown = len(ready)
        self.held = max(0, len(text.rstrip("\ufffd")) - self._shown)
        if self._shown >= len(text):  # all shown: the next token is decoded after the context alone (O(1) a token)
            self._window, self._shown = list(self._context), self._context_chars

    def continue_after(self, tokens: Sequence[int]) -> None:
        """Decode the reply after these tokens (a prompt's, ending mid-character), whose finished text is not the
        reply's. Raises what `decode` raises."""
        self._window = [*self._context, *tokens]
        self._shown = len(self._decode(self._window).rstrip("\ufffd"))

    def finalize(self) -> None:
        # A character the tokens leave unfinished is no text (`decode` writes it U+FFFD, as it would one the model
        # wrote as such, at the very end: vLLM's detokenizer holds either back).
        text = self._decode(self._window).rstrip("\ufffd")
        self._segment += text[self._shown:]
        self._window, self._shown, self.held = list(self._context), self._context_chars, 0

    @property
    def last_segment(self) -> str:
        """The text emitted since the last read. Raises nothing."""
        segment, self._segment = self._segment, ""
        return segment


def _text_vocab(tokenizer: Any) -> int:
    """How many ids the tokenizer can write (added tokens included); unbounded when it cannot say. Raises nothing."""
    try:
        return len(tokenizer) or 1 << 62
    except Exception:  # noqa: BLE001 — no length: every id is decoded
        return 1 << 62


def _held(detok: Any) -> int:
    """Whole characters the detokenizer holds back: mlx-lm's BPE one keeps a lone space until the next token
    says whether it is trimmed (a partial character counts nothing yet). Raises nothing."""
    if isinstance(detok, _ContextDetokenizer):
        return detok.held
    unflushed = getattr(detok, "_unflushed", None)
    if not unflushed:
        return 0
    if isinstance(unflushed, str) and hasattr(detok, "_decode_bytes"):
        return len(detok._maybe_trim_space(detok._decode_bytes(unflushed).rstrip("\ufffd")))
    if isinstance(unflushed, bytes):
        text = unflushed.replace("\u2581".encode(), b" ").decode("utf-8", "ignore")
        if not detok.text and getattr(detok, "trim_space", False) and text.startswith(" "):
            text = text[1:]
        return len(text)
    return 0
