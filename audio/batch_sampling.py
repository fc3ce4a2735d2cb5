"""How decoding rows pick their next tokens: the keyed sampler each row's task selects with, and rows of one
forward that all sample picking together — mlx-whisper's logit filters (SuppressBlank, SuppressTokens,
ApplyTimestampRules) and the keyed selection as one set of ops over the rows' logits instead of ~25 small ops a row.

Hand-written rather than mlx-whisper's filters called per row: those take one task's rows at a time, and each of
their ops costs a dispatch (on a GPU a kernel launch: a row's sampling cost ~0.26 ms on the H200; on this 2-core
CPU, tiny.en, 4 rows sampled in 6.6 ms one by one and 3.3 ms together). Same
operations in the same order per row: ApplyTimestampRules' host mask is its code for one row (including its
use of positions where OpenAI's Whisper uses token values), a row without a filter adds zeros (x + 0 is x), and a
row alone and rows together select through the same `_select`. MLX is imported inside the functions (see
audio/decoder.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["Drawn", "KeyedSampler", "apply_timestamp_rules", "can_sample_together", "sample_together"]

_ORDER = ("SuppressBlank", "SuppressTokens", "ApplyTimestampRules")  # as DecodingTask appends them


class KeyedSampler:
    """mlx-whisper's GreedyDecoder with the sampled (temperature > 0) draw keyed by (seed, token index)
    instead of the global RNG: a row samples the same tokens whoever shares its steps."""

    def __init__(self, temperature: float, eot: int, seed: int) -> None:
        self.temperature, self.eot, self.seed, self.index = temperature, eot, seed, 0
        self.logprob: Any = None  # the last token's log probability, (1,) lazy (DecodeRow.keep reads it)

    def update(self, tokens: Any, logits: Any, sum_logprobs: Any) -> tuple[Any, Any, Any]:
        """One row's step, as GreedyDecoder.update: (tokens with the next one appended, done, sum_logprobs)."""
        import mlx.core as mx

        next_tokens, sum_logprobs, self.logprob = _select(logits, [self], tokens[:, -1], sum_logprobs, self.eot)
        tokens = mx.concatenate([tokens, next_tokens[:, None]], axis=-1)
        return tokens, mx.all(tokens[:, -1] == self.eot), sum_logprobs


class Drawn:
    """Tokens rows sampled together in one step, (rows,) lazy, read from the device once for all of them (the
    rows append theirs from `ids`: audio/decoder.py's DecodeRow.draw)."""

    def __init__(self, tokens: Any) -> None:
        self.tokens = tokens
        self._ids: list[int] | None = None

    def ids(self) -> list[int]:
        """The tokens on the host (evaluates them the first time). Raises what MLX raises."""
        if self._ids is None:
            self._ids = [int(t) for t in self.tokens.tolist()]
        return self._ids


def can_sample_together(rows: list[Any]) -> bool:
    """Whether `rows` (DecodeRows) can sample together: each selects with a KeyedSampler, its filters are
    mlx-whisper's usual ones in their usual order, and all share one tokenizer's special tokens. Raises nothing."""
    from mlx_whisper.decoding import ApplyTimestampRules, SuppressBlank, SuppressTokens

    known = (SuppressBlank, SuppressTokens, ApplyTimestampRules)
    specials = set()
    for r in rows:
        if type(r.task.decoder) is not KeyedSampler:
            return False
        kinds = [type(f) for f in r.task.logit_filters]
        if any(k not in known for k in kinds) or [k.__name__ for k in kinds] != sorted(
                (k.__name__ for k in kinds), key=_ORDER.index):
            return False
        t = r.task.tokenizer
        specials.add((t.eot, t.timestamp_begin, t.no_timestamps))
    return len(specials) == 1


def sample_together(rows: list[Any], logits: Any) -> Drawn:
    """Filter `logits` (rows × vocabulary, float32, in `rows` order) as each row's filters would, select each
    row's next token as its sampler would, and append it: updates each row's tokens, sum_logprobs and sampler
    index, and keeps each row's token log probability where the row keeps them (DecodeRow.keep). Returns the tokens
    drawn (lazy; a row after its end of text draws end of text again). Raises what MLX raises."""
    import mlx.core as mx
    from mlx_whisper.decoding import ApplyTimestampRules, SuppressBlank, SuppressTokens

    vocab = int(logits.shape[1])
    histories = [r.context for r in rows]  # on the host: the step that drew their last tokens read them once
    zero = None
    for kind in (SuppressBlank, SuppressTokens):
        masks = []
        for r, seq in zip(rows, histories):
            f = next((f for f in r.task.logit_filters if isinstance(f, kind)), None)
            on = f is not None and (kind is not SuppressBlank or len(seq) == f.sample_begin)
            masks.append(f.mask if on and f is not None else None)
        if any(m is not None for m in masks):
            zero = mx.zeros((vocab,), mx.float32) if zero is None else zero
            logits = logits + mx.stack([m if m is not None else zero for m in masks])
    rules = [next((f for f in r.task.logit_filters if isinstance(f, ApplyTimestampRules)), None) for r in rows]
    tokenizer = rows[0].task.tokenizer
    if any(f is not None for f in rules):
        logits = apply_timestamp_rules(logits, rules, histories)
    last = mx.array([seq[-1] for seq in histories])
    sums = mx.concatenate([r.sum_logprobs for r in rows])
    next_tokens, sums, current = _select(logits, [r.task.decoder for r in rows], last, sums, tokenizer.eot)
    drawn = Drawn(next_tokens)
    for i, r in enumerate(rows):
        r.draw(drawn, i)
        r.sum_logprobs = sums[i:i + 1]
        r.keep(current, i)
    return drawn


def apply_timestamp_rules(logits: Any, rules: list[Any], histories: list[list[int]]) -> Any:
    """`logits` (rows × vocabulary, float32) as each row's mlx-whisper ApplyTimestampRules (None: none) leaves
    them after its whole context `histories[i]`. Raises what MLX raises."""
    import mlx.core as mx

    n, vocab = int(logits.shape[0]), int(logits.shape[1])
    # Each row's rules forbid a few ranges of the vocabulary: their bounds go to the device, not a rows ×
    # vocabulary host mask (on a GPU a managed buffer of 3.3 MB at 16 rows of large-v3, copied every token).
    bounds = np.zeros((n, 2, _RANGES), np.int32)  # [lo, hi) pairs; (0, 0) forbids nothing
    for i, (f, seq) in enumerate(zip(rules, histories)):
        if f is not None:
            for j, (lo, hi) in enumerate(_timestamp_ranges(f, seq, vocab)):
                bounds[i, :, j] = lo, hi
    where = mx.array(bounds)
    index = mx.arange(vocab)[None, None]
    forbidden = ((index >= where[:, 0, :, None]) & (index < where[:, 1, :, None])).any(axis=1)
    mask = mx.where(forbidden, -mx.inf, 0.0).astype(mx.float32)
    begin = next(f for f in rules if f is not None).tokenizer.timestamp_begin
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    timestamp_logprob = logprobs[:, begin:].logsumexp(axis=-1, keepdims=True)
    max_text_token_logprob = logprobs[:, :begin].max(axis=-1, keepdims=True)
    ruled = mx.array([[f is not None] for f in rules])
    mask[:, :begin] = mx.where((timestamp_logprob > max_text_token_logprob) & ruled, -mx.inf, mask[:, :begin])
    return logits + mask


def _select(logits: Any, samplers: list[KeyedSampler], last: Any, sums: Any, eot: int) -> tuple[Any, Any, Any]:
    """Each row's next token as its sampler picks it from `logits` (rows × vocabulary), `sums` (rows,) with
    its log-probability added, except after an end-of-text (`last` (rows,): each row's last token), where the
    next token is end-of-text again, and each row's log-probability of the token picked (rows,); advances each
    sampler's index. All lazy. Raises what MLX raises."""
    import mlx.core as mx

    next_tokens = logits.argmax(axis=-1)
    if any(s.temperature != 0 for s in samplers):
        picks = []
        for i, s in enumerate(samplers):
            if s.temperature == 0:
                picks.append(next_tokens[i:i + 1])
            else:
                key = mx.random.key(s.seed * 1_000_003 + s.index)
                picks.append(mx.random.categorical(logits[i:i + 1] / s.temperature, key=key))
        next_tokens = mx.concatenate(picks)
    for s in samplers:
        s.index += 1
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    current = logprobs[mx.arange(int(logits.shape[0])), next_tokens]
    sums = sums + current * (last != eot)
    eot_mask = last == eot
    return next_tokens * (1 - eot_mask) + eot * eot_mask, sums, current


def _timestamp_ranges(rule: Any, tokens: list[int], vocab: int) -> list[tuple[int, int]]:
    """The [lo, hi) ranges of the vocabulary that mlx-whisper's ApplyTimestampRules.apply host mask forbids for
    one row (`tokens`: its whole context): its code, each slice written as its bounds. Raises nothing."""
    t = rule.tokenizer
    out: list[tuple[int, int]] = []
    if t.no_timestamps is not None:
        out.append((t.no_timestamps, t.no_timestamps + 1))
    seq = tokens[rule.sample_begin:]
    last_was_timestamp = len(seq) >= 1 and seq[-1] >= t.timestamp_begin
    penultimate_was_timestamp = len(seq) < 2 or seq[-2] >= t.timestamp_begin
    if last_was_timestamp:
        if penultimate_was_timestamp:
            out.append((t.timestamp_begin, vocab))
        else:
            out.append((0, t.eot))
    timestamps = [i for i, v in enumerate(seq) if v > t.timestamp_begin]
    if timestamps:
        last_timestamp = timestamps[-1]
        if not last_timestamp or penultimate_was_timestamp:
            last_timestamp += 1
        out.append((t.timestamp_begin, last_timestamp))
    if len(tokens) == rule.sample_begin:
        out.append((0, t.timestamp_begin))
        if rule.max_initial_timestamp_index is not None:
            out.append((t.timestamp_begin + rule.max_initial_timestamp_index + 1, vocab))
    return out


_RANGES = 5  # the most ranges _timestamp_ranges gives a row
