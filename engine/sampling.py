"""Per-row samplers.

`RowSampler` turns one row's logits into a token (lazily: nothing is evaluated here) applying, in order: logit_bias,
repetition penalty (prompt + generated tokens), presence/frequency penalties (generated tokens; a penalty given a
window, mlx_lm.server's `*_context_size`, counts the last N tokens of prompt + reply instead:
engine/penalty_window.py), a grammar's mask (engine/constraints.py: tokens that would break the JSON asked for),
temperature, then top_p / min_p / XTC / top_k filters (mlx-lm's, in its order; XTC: engine/xtc.py), then a
categorical draw with the row's own PRNG key when seeded, so a seeded row's draws are its own whatever its batch
mates are (its logits are not: forwards of different batch sizes differ in the last bits, ~3e-5 for the demo model
on CPU, so a draw near a boundary can part a seeded reply from a copy that ran in another batch). A row that asked
for log probabilities also gets, lazily beside its token, the token's log probability under the raw logits and the k
likeliest tokens' (`take_logprob` reads them once the token is read). They queue in sampling order, so a row may
sample again before its last token is read (a pipelined step, engine/pipeline.py). vLLM's min_tokens masks a row's
end tokens (end-of-sequence and stop ids) for its first draws, in one op over the batch before any row samples, so
rows sharing a draw still share it (`sample_rows`).

A row's text and stop conditions are engine/stop_matcher.py's (`StopMatcher`, re-exported here).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from typing import Any, Callable, Iterable, Sequence, cast

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from engine.constraints import Constraint, ConstraintFailed
from engine.contracts import SamplingParams, TokenLogprob
from engine.errors import InvalidSampling
from engine.penalty_window import PenaltyWindows
from engine.stop_matcher import StepText, StopMatcher
from engine.xtc import apply_xtc

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
    for name in ("repetition_context_size", "presence_context_size", "frequency_context_size"):
        if (size := getattr(params, name)) is not None and size < 0:
            raise InvalidSampling(f"{name} must be >= 0", param=name)
    for name in ("xtc_probability", "xtc_threshold"):
        if not 0 <= getattr(params, name) <= 1:
            raise InvalidSampling(f"{name} must be in [0, 1]", param=name)
    # mlx-lm's sampler refuses a threshold above 0.5 where XTC runs (RowSampler's `_xtc`); its server takes up to 1,
    # so where XTC does not run (greedy, or probability 0) such a threshold passes, as there.
    if params.temperature > 0 and params.xtc_probability > 0 and params.xtc_threshold > 0.5:
        raise InvalidSampling("xtc_threshold must be in [0, 0.5] when XTC applies (xtc_probability > 0 and "
                              "temperature > 0), as mlx-lm's sampler: above 0.5 it could drop no token",
                              param="xtc_threshold")
    if params.logprobs is not None and not 0 <= params.logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidSampling(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]", param="top_logprobs")
    for tok in (params.logit_bias or {}):
        if not 0 <= int(tok) < vocab_size:
            raise InvalidSampling(f"logit_bias token id {tok} is outside the vocabulary (0..{vocab_size - 1})",
                                  param="logit_bias")


class RowSampler:
    """One row's sampling state: settings, PRNG key, and the token history penalties look at."""

    def __init__(self, params: SamplingParams, prompt_tokens: Sequence[int], vocab_size: int,
                 constraint: Constraint | None = None, xtc_special: Sequence[int] = (), ends: Iterable[int] = (),
                 min_tokens: int = 0) -> None:
        """`xtc_special`: the tokens XTC never drops (engine/xtc.py xtc_special_tokens); `ends`: the tokens that end
        the row, never drawn in its first `min_tokens` draws (vLLM's MinTokensLogitsProcessor)."""
        self.params = params
        self._ends = frozenset(t for t in ends if 0 <= t < vocab_size) if min_tokens > 0 else frozenset()
        self._min_tokens = min_tokens
        # Draws so far, counted as they are built: a pipelined step draws before the last token is read.
        self._drawn = 0
        self.vocab_size = vocab_size
        self._constraint = constraint
        self._failed: ConstraintFailed | None = None
        self._key = mx.random.key(params.seed) if params.seed is not None else None
        bias = params.logit_bias or {}
        self._bias = (mx.array([int(k) for k in bias]), mx.array([float(v) for v in bias.values()])) if bias else None
        # Penalties with a window are `_windows`'; those without, OpenAI's, these below.
        self._windows = PenaltyWindows.of(params, prompt_tokens)
        self._repetition = params.repetition_penalty if params.repetition_context_size is None else 1.0
        self._presence = params.presence_penalty if params.presence_context_size is None else 0.0
        self._frequency = params.frequency_penalty if params.frequency_context_size is None else 0.0
        self._seen: set[int] = set(prompt_tokens) if self._repetition != 1.0 else set()
        self._seen_arr: mx.array | None = None
        self._counts: Counter[int] = Counter()
        # Sampled tokens' log probabilities not yet read, oldest first: (their draw's block, this row's index in it).
        self._logprobs: deque[tuple[LogprobBlock, int]] = deque()
        top_k = params.top_k if 0 < params.top_k < vocab_size else 0
        # Each filter takes the log probabilities and XTC's coin key (None: the global generator's).
        self._filters: list[Callable[[mx.array, mx.array | None], mx.array]] = []
        self._xtc = params.temperature > 0 and params.xtc_probability > 0.0
        if params.temperature > 0:
            if params.top_p < 1.0:
                self._filters.append(lambda x, _: apply_top_p(x, params.top_p))
            if params.min_p > 0.0:
                self._filters.append(lambda x, _: apply_min_p(x, params.min_p))
            if self._xtc:
                special = mx.array(list(xtc_special)) if xtc_special else None
                self._filters.append(
                    lambda x, coin: apply_xtc(x, params.xtc_probability, params.xtc_threshold, special, coin))
            if top_k:
                self._filters.append(lambda x, _: apply_top_k(x, top_k))

    @property
    def plain_greedy(self) -> bool:
        """Greedy with no logits processing: batch mates can share one argmax."""
        p = self.params
        return (p.temperature == 0 and self._bias is None and p.repetition_penalty == 1.0
                and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0 and self._constraint is None)

    @property
    def plain(self) -> bool:
        """Greedy or plain temperature, unseeded, no processors: batch mates share one draw."""
        return self.plain_greedy or (self.params.temperature > 0 and self._key is None and not self._filters
                                     and self._bias is None and self._constraint is None
                                     and self.params.repetition_penalty == 1.0
                                     and self.params.presence_penalty == 0.0 and self.params.frequency_penalty == 0.0)

    @property
    def pipelines(self) -> bool:
        """Plain: its next step may sample before this one's token is read (engine/pipeline.py); log
        probabilities queue beside the tokens. Raises nothing."""
        return self.plain

    def sample(self, logits: mx.array, raw: mx.array | None = None) -> mx.array:
        """Sample from one row's logits, shape (1, vocab) → (1,) token array, unevaluated; `raw`: the model's logits
        before `sample_rows` masked any (the log probabilities'; None: `logits`). Raises nothing."""
        token = self._draw(logits)
        if self.params.logprobs is not None:
            self._logprobs.append((_logprobs(logits if raw is None else raw, token, self.params.logprobs), 0))
        return token

    def held_ends(self) -> frozenset[int]:
        """The end tokens this draw may not pick (none past the first min_tokens draws), counting the draw: called
        once per draw, by `sample_rows`. Raises nothing."""
        if not self._ends:  # none asked, or past them: nothing to count (the every-step path of plain rows)
            return self._ends
        self._drawn += 1
        if self._drawn > self._min_tokens:
            self._ends = frozenset()
        return self._ends

    def _draw(self, logits: mx.array) -> mx.array:
        p = self.params
        if self._bias is not None:
            logits = logits.at[:, self._bias[0]].add(self._bias[1])
        if self._repetition != 1.0 and self._seen:
            if self._seen_arr is None:
                self._seen_arr = mx.array(sorted(self._seen))
            sel = logits[:, self._seen_arr]
            sel = mx.where(sel < 0, sel * self._repetition, sel / self._repetition)
            logits = logits[:]  # written into: a copy, as the caller's logits stay raw for the log probabilities
            logits[:, self._seen_arr] = sel
        if self._windows is not None:
            logits = self._windows.apply(logits[:])  # mlx-lm's processors write into theirs: a copy, as above
        if (self._presence or self._frequency) and self._counts:
            ids = mx.array(list(self._counts))
            pen = mx.array([self._presence + self._frequency * c for c in self._counts.values()])
            logits = logits.at[:, ids].subtract(pen)
        if self._constraint is not None and self._failed is None:
            try:
                allowed = self._constraint.mask()
            except ConstraintFailed as exc:  # this row's grammar alone: it ends as its token is taken (accept)
                self._failed, allowed = exc, None
            if allowed is not None:
                logits = mx.where(allowed[:, : logits.shape[-1]], logits, -mx.inf)
        if p.temperature == 0:
            return mx.argmax(logits, axis=-1)
        x = logits.astype(mx.float32) * (1.0 / p.temperature)
        draw = coin = None
        if self._key is not None:  # XTC's coin from a key of its own, so rows without XTC keep their draws
            self._key, draw, *rest = mx.random.split(self._key, 3 if self._xtc else 2)
            coin = rest[0] if rest else None
        if self._filters:
            x = x - mx.logsumexp(x, axis=-1, keepdims=True)
            for f in self._filters:
                x = f(x, coin)
        return mx.random.categorical(x) if draw is None else mx.random.categorical(x, key=draw)

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
        """Record a sampled token so the penalties see it. Raises ConstraintFailed when the row's grammar failed as
        the token was drawn (the step ends that row alone, its batch mates go on)."""
        if self._failed is not None:
            raise self._failed
        if self._repetition != 1.0 and token not in self._seen:
            self._seen.add(token)
            self._seen_arr = None
        if self._presence or self._frequency:
            self._counts[token] += 1
        if self._windows is not None:
            self._windows.accept(token)
        if self._constraint is not None:
            self._constraint.accept(token)


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
    raw, logits = logits, _hold_ends(logits, samplers)  # log probabilities are the raw logits'
    if all(s.plain_greedy for s in samplers):
        tokens = mx.argmax(logits, axis=-1)
        _shared_logprobs(raw, tokens, samplers, range(len(samplers)))
        return tokens
    plain = [i for i, s in enumerate(samplers) if s.plain]
    if len(plain) == len(samplers):
        tokens = _sample_plain(logits, samplers)
        _shared_logprobs(raw, tokens, samplers, plain)
        return tokens
    if len(plain) < 2:
        picks = [s.sample(logits[i : i + 1], raw[i : i + 1]) for i, s in enumerate(samplers)]
        return picks[0] if len(picks) == 1 else mx.concatenate(picks)
    # Plain rows in one draw, the others one by one; then back into row order.
    rest = [i for i in range(len(samplers)) if i not in set(plain)]
    parts = [_sample_plain(logits[mx.array(plain)], [samplers[i] for i in plain])]
    parts += [samplers[i].sample(logits[i : i + 1], raw[i : i + 1]) for i in rest]
    where = {row: n for n, row in enumerate(plain + rest)}
    tokens = mx.concatenate(parts)[mx.array([where[i] for i in range(len(samplers))])]
    _shared_logprobs(raw, tokens, samplers, plain)
    return tokens


def _hold_ends(logits: mx.array, samplers: Sequence[RowSampler]) -> mx.array:
    """`logits` with each row's held end tokens (min_tokens) at -inf, in one op over the batch; the same array
    when no row holds any. Lazy. Raises nothing."""
    held = [s.held_ends() for s in samplers]
    if not any(held):
        return logits
    ids = sorted(set().union(*held))
    # (rows, ids): -inf where that row holds that id, 0 elsewhere.
    mask = mx.array([[-math.inf if t in h else 0.0 for t in ids] for h in held], dtype=logits.dtype)
    return logits.at[:, mx.array(ids)].add(mask)


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
