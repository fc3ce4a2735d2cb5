"""Per-row samplers and stop matching.

`RowSampler` turns one row's logits into a token (lazily: nothing is evaluated here) applying, in order:
logit_bias, repetition penalty (prompt + generated tokens), presence/frequency penalties (generated
tokens), temperature, then top_p / min_p / top_k filters (mlx-lm's), then a categorical draw with the
row's own PRNG key when seeded, so a seeded row's draws are its own whatever its batch mates are (its logits are
not: forwards of different batch sizes differ in the last bits, ~3e-5 for the demo model on CPU, so a draw near a
boundary can part a seeded reply from a copy that ran in another batch). A row that asked for
log probabilities also gets, lazily beside its token, the token's log probability under the raw logits and the
k likeliest tokens' (`take_logprob` reads them once the token is read). They queue in sampling order, so a row may
sample again before its last token is read (a pipelined step, engine/pipeline.py).

`StopMatcher` turns sampled tokens into text: streaming detokenization through mlx-lm's detokenizers, or the
tokenizer's own decode where mlx-lm has only its generic one (never splits a UTF-8 character), stop token ids, stop
strings with hold-back, and max_tokens.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Iterable, Sequence, cast

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p
from mlx_lm.tokenizer_utils import NaiveStreamingDetokenizer

from engine.contracts import FinishReason, SamplingParams, TokenLogprob
from engine.errors import InvalidSampling
from engine.special_tokens import hidden_special_ids

__all__ = ["RowSampler", "StopMatcher", "StepText", "LogprobBlock", "newest_logprobs", "sample_rows",
           "validate_sampling", "MAX_TOP_LOGPROBS"]

MAX_TOP_LOGPROBS = 20  # OpenAI's bound


def validate_sampling(params: SamplingParams, vocab_size: int) -> None:
    """Reject values no sampler can honour. Raises InvalidSampling naming the parameter."""
    if params.temperature < 0:
        raise InvalidSampling("temperature must be >= 0", param="temperature")
    if not 0 < params.top_p <= 1:
        raise InvalidSampling("top_p must be in (0, 1]", param="top_p")
    if params.top_k < 0:
        raise InvalidSampling("top_k must be >= 0", param="top_k")
    if not 0 <= params.min_p <= 1:
        raise InvalidSampling("min_p must be in [0, 1]", param="min_p")
    if params.repetition_penalty <= 0:
        raise InvalidSampling("repetition_penalty must be > 0", param="repetition_penalty")
    if params.logprobs is not None and not 0 <= params.logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidSampling(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]", param="top_logprobs")
    for tok in (params.logit_bias or {}):
        if not 0 <= int(tok) < vocab_size:
            raise InvalidSampling(f"logit_bias token id {tok} is outside the vocabulary (0..{vocab_size - 1})",
                                  param="logit_bias")


class RowSampler:
    """One row's sampling state: settings, PRNG key, and the token history penalties look at."""

    def __init__(self, params: SamplingParams, prompt_tokens: Sequence[int], vocab_size: int) -> None:
        self.params = params
        self.vocab_size = vocab_size
        self._key = mx.random.key(params.seed) if params.seed is not None else None
        bias = params.logit_bias or {}
        self._bias = (mx.array([int(k) for k in bias]), mx.array([float(v) for v in bias.values()])) if bias else None
        self._seen: set[int] = set(prompt_tokens) if params.repetition_penalty != 1.0 else set()
        self._seen_arr: mx.array | None = None
        self._counts: Counter[int] = Counter()
        # Sampled tokens' log probabilities not yet read, oldest first: (their draw's block, this row's index in it).
        self._logprobs: deque[tuple[LogprobBlock, int]] = deque()
        top_k = params.top_k if 0 < params.top_k < vocab_size else 0
        self._filters = []
        if params.temperature > 0:
            if params.top_p < 1.0:
                self._filters.append(lambda x: apply_top_p(x, params.top_p))
            if params.min_p > 0.0:
                self._filters.append(lambda x: apply_min_p(x, params.min_p))
            if top_k:
                self._filters.append(lambda x: apply_top_k(x, top_k))

    @property
    def plain_greedy(self) -> bool:
        """Greedy with no logits processing: batch mates can share one argmax."""
        p = self.params
        return (p.temperature == 0 and self._bias is None and p.repetition_penalty == 1.0
                and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0)

    @property
    def plain(self) -> bool:
        """Greedy or plain temperature, unseeded, no processors: batch mates share one draw."""
        return self.plain_greedy or (self.params.temperature > 0 and self._key is None and not self._filters
                                     and self._bias is None and self.params.repetition_penalty == 1.0
                                     and self.params.presence_penalty == 0.0 and self.params.frequency_penalty == 0.0)

    @property
    def pipelines(self) -> bool:
        """Plain: its next step may sample before this one's token is read (engine/pipeline.py); log
        probabilities queue beside the tokens. Raises nothing."""
        return self.plain

    def sample(self, logits: mx.array) -> mx.array:
        """Sample from one row's logits, shape (1, vocab) → (1,) token array, unevaluated. Raises nothing."""
        token = self._draw(logits)
        if self.params.logprobs is not None:
            self._logprobs.append((_logprobs(logits, token, self.params.logprobs), 0))
        return token

    def _draw(self, logits: mx.array) -> mx.array:
        p = self.params
        if self._bias is not None:
            logits = logits.at[:, self._bias[0]].add(self._bias[1])
        if p.repetition_penalty != 1.0 and self._seen:
            if self._seen_arr is None:
                self._seen_arr = mx.array(sorted(self._seen))
            sel = logits[:, self._seen_arr]
            sel = mx.where(sel < 0, sel * p.repetition_penalty, sel / p.repetition_penalty)
            logits[:, self._seen_arr] = sel
        if (p.presence_penalty or p.frequency_penalty) and self._counts:
            ids = mx.array(list(self._counts))
            pen = mx.array([p.presence_penalty + p.frequency_penalty * c for c in self._counts.values()])
            logits = logits.at[:, ids].subtract(pen)
        if p.temperature == 0:
            return mx.argmax(logits, axis=-1)
        x = logits.astype(mx.float32) * (1.0 / p.temperature)
        if self._filters:
            x = x - mx.logsumexp(x, axis=-1, keepdims=True)
            for f in self._filters:
                x = f(x)
        if self._key is not None:
            self._key, sub = mx.random.split(self._key)
            return mx.random.categorical(x, key=sub)
        return mx.random.categorical(x)

    def arrays(self) -> list[mx.array]:
        """The arrays this sampler keeps between tokens (a seeded row's random key, unread log probabilities), to
        evaluate on the thread that sampled before another thread samples next. Raises nothing."""
        return ([self._key] if self._key is not None else []) + [a for b, _ in self._logprobs for a in b.arrays]

    def newest_logprobs(self) -> LogprobBlock | None:
        """The block holding the last sampled token's log probabilities (None when not asked for), to launch
        with that token. Raises nothing."""
        return self._logprobs[-1][0] if self._logprobs else None

    def take_logprob(self, token: int) -> TokenLogprob | None:
        """The log probabilities computed beside `token` (the oldest sampled token not yet read), once; None
        when not asked for. Blocks until they are evaluated. Raises nothing of its own."""
        if not self._logprobs:
            return None
        block, index = self._logprobs.popleft()
        return block.row(index, token, cast(int, self.params.logprobs))

    def accept(self, token: int) -> None:
        """Record a sampled token so the penalties see it. Raises nothing."""
        if self.params.repetition_penalty != 1.0 and token not in self._seen:
            self._seen.add(token)
            self._seen_arr = None
        if self.params.presence_penalty or self.params.frequency_penalty:
            self._counts[token] += 1


class LogprobBlock:
    """One draw's log probabilities for the rows that asked: lazy arrays (each row's token's, and the k likeliest
    ids and theirs, k the largest asked), read into Python lists once, by the first of those rows to take its own."""

    def __init__(self, logits: mx.array, tokens: mx.array, k: int) -> None:
        """`logits` (rows, vocab) raw, as mlx-lm's server reports them; `tokens` (rows,) the tokens drawn."""
        # The raw logits rank as their log probabilities do: the log-sum-exp is taken off only the values read
        # (H200, bench/logprob_ops.py, 64 rows: 0.13 ms to launch and 0.59 ms a step against 0.21 and 0.81).
        x = logits.astype(mx.float32)
        lse = mx.logsumexp(x, axis=-1, keepdims=True)
        chosen = (mx.take_along_axis(x, tokens[:, None], axis=-1) - lse)[:, 0]
        self.k = min(k, x.shape[-1])
        if self.k:
            ids = mx.argpartition(-x, self.k - 1, axis=-1)[:, :self.k]
            top = mx.take_along_axis(x, ids, axis=-1)
            order = mx.argsort(-top, axis=-1)
            self.arrays: tuple[mx.array, ...] = (chosen, mx.take_along_axis(ids, order, axis=-1),
                                                 mx.take_along_axis(top, order, axis=-1) - lse)
        else:
            self.arrays = (chosen,)
        self._lists: tuple[list[Any], ...] | None = None

    def row(self, index: int, token: int, k: int) -> TokenLogprob:
        """Row `index`'s entry (its k likeliest of the block's). Blocks until evaluated. Raises nothing of its own."""
        if self._lists is None:
            self._lists = tuple(cast(list[Any], a.tolist()) for a in self.arrays)
            self.arrays = ()  # read: the arrays are done with
        chosen = self._lists[0][index]
        top = tuple(zip(self._lists[1][index][:k], self._lists[2][index][:k])) if self.k and k else ()
        return TokenLogprob(token, float(chosen), tuple((int(i), float(v)) for i, v in top))


def newest_logprobs(rows: Iterable[Any]) -> list[mx.array]:
    """The arrays of the log probabilities the rows' samplers (`row.sampler`) just computed, each block once: to
    launch with the tokens they belong to. Raises nothing."""
    blocks = {id(b): b for r in rows if (b := r.sampler.newest_logprobs()) is not None}
    return [a for b in blocks.values() for a in b.arrays]


def _logprobs(logits: mx.array, token: mx.array, k: int) -> LogprobBlock:
    """A block of one row, sampled alone: `logits` (1, vocab), `token` (1,). Lazy. Raises nothing."""
    return LogprobBlock(logits, token, k)


def sample_rows(logits: mx.array, samplers: Sequence[RowSampler]) -> mx.array:
    """Lazily sample every row of `logits` (rows, vocab) → (rows,) token ids; plain-greedy batches share one
    argmax. Raises ValueError if the row counts differ."""
    if logits.shape[0] != len(samplers):
        raise ValueError(f"{logits.shape[0]} logit rows for {len(samplers)} samplers")
    if all(s.plain_greedy for s in samplers):
        tokens = mx.argmax(logits, axis=-1)
        _shared_logprobs(logits, tokens, samplers, range(len(samplers)))
        return tokens
    plain = [i for i, s in enumerate(samplers) if s.plain]
    if len(plain) == len(samplers):
        tokens = _sample_plain(logits, samplers)
        _shared_logprobs(logits, tokens, samplers, plain)
        return tokens
    if len(plain) < 2:
        picks = [s.sample(logits[i : i + 1]) for i, s in enumerate(samplers)]
        return picks[0] if len(picks) == 1 else mx.concatenate(picks)
    # Plain rows in one draw, the others one by one; then back into row order.
    rest = [i for i in range(len(samplers)) if i not in set(plain)]
    parts = [_sample_plain(logits[mx.array(plain)], [samplers[i] for i in plain])]
    parts += [samplers[i].sample(logits[i : i + 1]) for i in rest]
    where = {row: n for n, row in enumerate(plain + rest)}
    tokens = mx.concatenate(parts)[mx.array([where[i] for i in range(len(samplers))])]
    _shared_logprobs(logits, tokens, samplers, plain)
    return tokens


def _shared_logprobs(logits: mx.array, tokens: mx.array, samplers: Sequence[RowSampler], rows: Iterable[int]) -> None:
    """Log probabilities for the rows among `rows` that want them, in one set of ops over all of them (rows
    sampled in a shared draw; a row sampled alone computed its own). Lazy. Raises nothing."""
    want = [i for i in rows if samplers[i].params.logprobs is not None]
    if not want:
        return
    pick = None if len(want) == logits.shape[0] else mx.array(want)
    block = LogprobBlock(logits if pick is None else logits[pick], tokens if pick is None else tokens[pick],
                         max(cast(int, samplers[i].params.logprobs) for i in want))
    for j, i in enumerate(want):
        samplers[i]._logprobs.append((block, j))


def _sample_plain(logits: mx.array, samplers: Sequence[RowSampler]) -> mx.array:
    """Greedy and plain-temperature rows together: one argmax, one categorical, one select."""
    temps = [s.params.temperature for s in samplers]
    greedy = mx.argmax(logits, axis=-1)
    if not any(temps):
        return greedy
    inv = mx.array([1.0 / t if t > 0 else 1.0 for t in temps], dtype=mx.float32)
    drawn = mx.random.categorical(logits.astype(mx.float32) * inv[:, None])
    if all(temps):
        return drawn
    return mx.where(mx.array([t == 0 for t in temps]), greedy, drawn)


@dataclass
class StepText:
    """What one sampled token turned into: text now safe to emit, and whether the row is done."""

    text: str
    finish_reason: FinishReason | None


class StopMatcher:
    """Incremental detokenization plus stop conditions for one row."""

    def __init__(self, tokenizer: Any, *, stop: Iterable[str] = (), stop_token_ids: Iterable[int] = (),
                 max_tokens: int, keep_leading_space: bool = False, skip_special_tokens: bool = True) -> None:
        self._detok = tokenizer.detokenizer
        if isinstance(self._detok, NaiveStreamingDetokenizer):  # no tokenizer.json: a plain `decode` (see the class)
            self._detok = _ContextDetokenizer(tokenizer, getattr(self._detok, "_clean_spaces", True), keep_leading_space)
        elif keep_leading_space:
            _keep_leading_space(self._detok)
        self.stop_strings = [s for s in stop if s]
        self.stop_ids = set(stop_token_ids) | set(getattr(tokenizer, "eos_token_ids", ()) or ())
        # Special tokens written mid-reply are markup, not text (engine/special_tokens.py); they still count.
        self._hidden = hidden_special_ids(tokenizer) if skip_special_tokens else frozenset()
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

    def position(self) -> int:
        """Where the next token's text starts in the row's text (with stop strings; 0 without). Raises nothing."""
        if not self.stop_strings:
            return 0
        return self.shown + len(self._pending) + _held(self._detok)

    def shown_before(self) -> float:
        """Text starting before this position has been emitted (a token's whose text starts there was shown);
        everything when there are no stop strings or the row ended without a cut. Raises nothing."""
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
        if token in self.stop_ids:
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
        self.shown += len(text)
        return StepText(text, None)

    def _finish(self, reason: FinishReason) -> StepText:
        self._detok.finalize()
        self._pending += self._detok.last_segment
        cut = self._find_stop()
        if cut is not None:
            reason = "stop"
            text = self._pending[:cut]
            self._cut_at = self.shown + cut
        else:
            text = self._pending
        self.shown += len(text)
        self._pending = ""
        self.finish_reason = reason
        return StepText(text, reason)

    def _find_stop(self) -> int | None:
        if not self.stop_strings:
            return None
        hits = [i for i in (self._pending.find(s) for s in self.stop_strings) if i >= 0]
        return min(hits) if hits else None

    def _holdback(self) -> int:
        """Length of the longest suffix of the pending text that could begin a stop string."""
        best = 0
        for s in self.stop_strings:
            for n in range(min(len(s) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(s[:n]):
                    best = n
                    break
        return best


def _keep_leading_space(detok: Any) -> None:
    """Keep the space mlx-lm's detokenizers trim off a reply's first token: a completion continues its prompt
    (" 4" after "1, 2, 3,"), and its text must match its tokens. Raises nothing."""
    if hasattr(detok, "trim_space"):  # SentencePiece
        detok.trim_space = False
    elif hasattr(detok, "_maybe_trim_space"):  # byte-level BPE: the instance's own method shadows the class's
        detok._maybe_trim_space = lambda text: text


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

    def finalize(self) -> None:
        text = self._decode(self._window)
        self._segment += text[self._shown:]  # a character never completed stays U+FFFD, as in a full decode
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
