"""Whisper decoding rows advanced together, a few tokens per step, like LLM decode rows.

Each row is one decoding attempt of one window at one temperature: mlx-whisper's DecodingTask supplies its
initial tokens, logit filters and token selection; the row holds its own self-attention KV and its
window's cross-attention KV (computed once per window by the encoder). A forward packs every row's new
tokens into one matrix, so each linear layer runs once for all rows; attention runs per row against its
own KV, or, once every row only feeds its last sampled token, batched over stacked caches (audio/decode_batch.py;
on a GPU by default). A row alone computes exactly what mlx-whisper's decode loop computes for a batch of one. MLX is
imported inside the functions: importing audio/ must not import mlx before the fast BLAS is loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from audio.batch_sampling import Drawn, KeyedSampler, can_sample_together, sample_together
from audio.decode_batch import RowBatch, batch_enabled, own_kv

__all__ = ["DecodeRow", "RowResult", "Forward", "new_row", "step_rows", "advance_rows", "finish_row", "detect_language"]


@dataclass
class RowResult:
    """A finished attempt: `tokens` = forced prefix + sampled tokens (no EOT); scores on the sampled part;
    `logprobs`: each sampled token's log probability, where its row kept them (else None)."""

    tokens: list[int]
    sampled: list[int]
    text: str
    avg_logprob: float
    no_speech_prob: float
    temperature: float
    compression_ratio: float
    logprobs: tuple[float, ...] | None = None


@dataclass(eq=False)
class DecodeRow:
    """One decoding attempt. Its context so far (prompt, SOT sequence, prefix, sampled) is held on the host
    (`context`) and as a (1, L) array (`tokens`), each made from the other when asked for: rows sampling
    together append their tokens from one read of the step (`Drawn`) instead of one device read each, which on
    a GPU costs a managed-memory copy a row per token."""

    task: Any  # mlx_whisper.decoding.DecodingTask
    cross_kv: list[tuple[Any, Any]]
    prefix: list[int]
    _context: list[int] | None  # the context on the host (None: only `_array` holds it)
    fed: int = 0  # tokens already in the self-attention KV
    kv: list[Any] = field(default_factory=list)
    sum_logprobs: Any = None
    no_speech_prob: float = float("nan")
    sampled: int = 0
    done: bool = False
    batch: Any = None  # (RowBatch, slot) while its keys/values live in a batch (audio/decode_batch.py)
    _array: Any = None  # the context as a (1, L) array (None: made from `_context` when asked for)
    _drawn: tuple[Drawn, int] | None = None  # its newest token, sampled together with other rows', not read yet
    # Each sampled token's log probability as (the step's lazy (rows,) array, this row's index), read once when
    # the row finishes (finish_row), not a device read a step; None: not kept (a request without `logprobs`).
    logprobs: list[tuple[Any, int]] | None = None

    @property
    def tokens(self) -> Any:
        """The context as a (1, L) array. Raises what MLX raises."""
        import mlx.core as mx

        self._settle()
        if self._array is None:
            self._array = mx.array([self._context])
        return self._array

    @tokens.setter
    def tokens(self, value: Any) -> None:
        self._array, self._context, self._drawn = value, None, None

    @property
    def context(self) -> list[int]:
        """The context on the host (read from the device once after `tokens` was set). Raises what MLX raises."""
        self._settle()
        if self._context is None:
            self._context = [int(t) for t in self._array.tolist()[0]]
        return self._context

    @property
    def length(self) -> int:
        """Tokens in the context, read from neither the device nor a pending draw. Raises nothing."""
        held = len(self._context) if self._context is not None else int(self._array.shape[1])
        return held + (self._drawn is not None)

    def draw(self, drawn: Drawn, i: int) -> None:
        """Append row `i` of `drawn` (a token sampled together with other rows', lazy: read when the context is
        next asked for). Raises what MLX raises (settling an earlier draw)."""
        self._settle()
        self._drawn = (drawn, i)

    def _settle(self) -> None:
        """A pending draw joins the context: on the host from the draw's one read where the context is there
        (the array, now behind, goes), else unread onto the array. Raises what MLX raises."""
        if self._drawn is None:
            return
        drawn, i = self._drawn
        self._drawn = None
        if self._context is not None:
            self._context.append(drawn.ids()[i])
            self._array = None
        else:
            import mlx.core as mx

            self._array = mx.concatenate([self._array, drawn.tokens[i:i + 1][:, None]], axis=-1)

    def keep(self, logprobs: Any, i: int) -> None:
        """Keep row `i` of `logprobs` (a step's lazy (rows,) log probabilities) as its newest token's, where this row
        keeps them. Raises nothing."""
        if self.logprobs is not None:
            self.logprobs.append((logprobs, i))

    @property
    def feeds_last_token(self) -> bool:
        """Only its last sampled token is unfed (its prompt and SOT are in its keys): it may decode in a batch."""
        return self.length - self.fed == 1 and self.task.sot_index < self.fed

    @property
    def temperature(self) -> float:
        return float(self.task.options.temperature)


def new_row(model: Any, options: Any, cross_kv: list[tuple[Any, Any]], prefix: list[int], seed: int = 0) -> DecodeRow:
    """A row for mlx-whisper DecodingOptions `options` (greedy or sampled; no beams); sampled draws are keyed
    by `seed`. A non-empty `prefix` is forced: the timestamp rules then see it as already sampled, so a prefix
    may end mid-segment. Engine thread only. Raises ValueError for options mlx-whisper refuses."""
    from dataclasses import replace

    import mlx.core as mx

    from mlx_whisper.decoding import ApplyTimestampRules, DecodingTask, SuppressBlank

    task = DecodingTask(model, replace(options, prefix=list(prefix) or None))
    task.decoder = KeyedSampler(options.temperature, task.tokenizer.eot, seed)
    if prefix:
        start = task.sample_begin - len(prefix)
        for f in task.logit_filters:
            if isinstance(f, (ApplyTimestampRules, SuppressBlank)):
                f.sample_begin = start
    row = DecodeRow(task, cross_kv, list(prefix), [int(t) for t in task.initial_tokens])
    row.kv = [None] * len(model.decoder.blocks)
    row.sum_logprobs = mx.zeros(1)
    return row


def detect_language(model: Any, features: Any, among: Sequence[str] = ()) -> str:
    """The most probable language of a window from its encoder output (1, n_ctx, D), as mlx-whisper's
    detect_language computes it; that one re-encodes features whose context is not the model's whole window.
    `among`: Whisper's codes of the languages the speech may be in (OpenAI's `languages`): the most probable of
    their tokens wins (none given: of all). Engine thread only. Raises ValueError for a model without language
    tokens, or none of `among`."""
    import mlx.core as mx

    from mlx_whisper.tokenizer import get_tokenizer

    tokenizer = get_tokenizer(model.is_multilingual, num_languages=model.num_languages)
    if tokenizer.language is None or tokenizer.language_token not in tokenizer.sot_sequence:
        raise ValueError("This model doesn't have language tokens so it can't perform lang id")
    logits = model.logits(mx.array([[tokenizer.sot]]), features)[0, 0]
    codes = dict(zip(tokenizer.all_language_tokens, tokenizer.all_language_codes))
    tokens = [t for t, code in codes.items() if not among or code in among]
    if not tokens:
        raise ValueError(f"This model has no language token for any of {', '.join(among)}")
    best = mx.argmax(logits[mx.array(tokens)]).item()
    return codes[tokens[int(best)]]  # type: ignore[arg-type]


def _cross_attention(attn: Any, q: Any, k: Any, v: Any) -> Any:
    # mlx-whisper's qkv_attention with the keys/values already scaled and laid out (audio/encoder.cross_kv).
    import mlx.core as mx

    n_batch, n_ctx, n_state = q.shape
    q = q.reshape(n_batch, n_ctx, attn.n_head, -1).transpose(0, 2, 1, 3) * (n_state // attn.n_head) ** -0.25
    w = mx.softmax(q @ k, axis=-1, precise=True)
    return (w @ v).transpose(0, 2, 1, 3).reshape(n_batch, n_ctx, n_state)


def _self_attention(attn: Any, q: Any, k: Any, v: Any, mask: Any) -> Any:
    # mlx-whisper's qkv_attention with the causal mask already cut to these queries' positions (a prompt fed
    # in chunks attends to the keys cached before it); same operations, same order.
    import mlx.core as mx

    n_batch, n_ctx, n_state = q.shape
    scale = (n_state // attn.n_head) ** -0.25
    q = q.reshape(*q.shape[:2], attn.n_head, -1).transpose(0, 2, 1, 3) * scale
    k = k.reshape(*k.shape[:2], attn.n_head, -1).transpose(0, 2, 3, 1) * scale
    v = v.reshape(*v.shape[:2], attn.n_head, -1).transpose(0, 2, 1, 3)
    w = mx.softmax(q @ k + mask, axis=-1, precise=True)
    return (w @ v).transpose(0, 2, 1, 3).reshape(n_batch, n_ctx, n_state)


@dataclass
class Forward:
    """What one packed forward did: tokens fed (all rows), rows that sampled a token, whether logits ran."""

    tokens: int
    sampled: int
    logits: bool


def _forward(model: Any, rows: list[DecodeRow], feed: int | None,
             company: Sequence[DecodeRow] = ()) -> tuple[list[Any], list[Any], Any]:
    """Feed every row its next unfed tokens (at most `feed` each; None: all); returns each row's last-position
    logits (None for a row still feeding its prompt) and, for rows whose chunk holds their SOT position, the
    logits there (for the no-speech probability), and, when every row of several samples, all their logits
    stacked (rows × vocabulary, in `rows` order; else None)."""
    import mlx.core as mx
    import mlx.nn as nn

    dec = model.decoder
    total = [r.length for r in rows]
    sizes = [t - r.fed if feed is None else min(feed, t - r.fed) for r, t in zip(rows, total)]
    if len(rows) > 1 and all(r.feeds_last_token for r in rows) and batch_enabled():
        return _forward_batched(model, rows, company)
    for r in rows:
        own_kv(r)
    inputs = [r.tokens[:, r.fed:r.fed + n] for r, n in zip(rows, sizes)]
    embeds = [dec.token_embedding(t) + dec.positional_embedding[r.fed:r.fed + n]
              for r, t, n in zip(rows, inputs, sizes)]
    x = mx.concatenate(embeds, axis=1) if len(rows) > 1 else embeds[0]
    bounds = []
    at = 0
    for n in sizes:
        bounds.append((at, at + n))
        at += n

    def split(y: Any) -> list[Any]:
        return [y[:, a:b] for a, b in bounds] if len(rows) > 1 else [y]

    def join(parts: list[Any]) -> Any:
        return mx.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]

    masks = [dec._mask[r.fed:r.fed + n, :r.fed + n] for r, n in zip(rows, sizes)]
    for layer, block in enumerate(dec.blocks):
        h = block.attn_ln(x)
        qs, ks, vs = split(block.attn.query(h)), split(block.attn.key(h)), split(block.attn.value(h))
        outs = []
        for r, q, k, v, mask in zip(rows, qs, ks, vs, masks):
            if r.kv[layer] is not None:
                k = mx.concatenate([r.kv[layer][0], k], axis=1)
                v = mx.concatenate([r.kv[layer][1], v], axis=1)
            r.kv[layer] = (k, v)
            outs.append(_self_attention(block.attn, q, k, v, mask))
        x = x + block.attn.out(join(outs))
        qs = split(block.cross_attn.query(block.cross_attn_ln(x)))
        outs = [_cross_attention(block.cross_attn, q, *r.cross_kv[layer]) for r, q in zip(rows, qs)]
        x = x + block.cross_attn.out(join(outs))
        x = x + block.mlp2(nn.gelu(block.mlp1(block.mlp_ln(x))))
    ending = [i for i, (r, n, t) in enumerate(zip(rows, sizes, total)) if r.fed + n == t]
    at_sot = [i for i, (r, n) in enumerate(zip(rows, sizes)) if r.fed <= r.task.sot_index < r.fed + n]
    picks = [bounds[i][1] - 1 for i in ending] + [bounds[i][0] + rows[i].task.sot_index - rows[i].fed for i in at_sot]
    last: list[Any] = [None] * len(rows)
    sot: list[Any] = [None] * len(rows)
    if picks:
        x = dec.ln(x)
        x = x if picks == list(range(at)) else x[:, mx.array(picks)]
        logits = dec.token_embedding.as_linear(x).astype(mx.float32)[0]
        for n, i in enumerate(ending):
            last[i] = logits[n:n + 1]
        for n, i in enumerate(at_sot):
            sot[i] = logits[len(ending) + n: len(ending) + n + 1]
    for r, n in zip(rows, sizes):
        r.fed += n
    # Every row samples and none is at its SOT: the logits are the rows', in order, to sample together.
    together = logits if picks and len(rows) > 1 and not at_sot and len(ending) == len(rows) else None
    return last, sot, together


def _forward_batched(model: Any, rows: list[DecodeRow],
                     company: Sequence[DecodeRow]) -> tuple[list[Any], list[Any], Any]:
    """_forward for rows that each feed only their last sampled token: attention batched over a RowBatch
    (kept while its rows go on together, in turns or all at once). Raises what MLX raises."""
    import mlx.core as mx

    dec = model.decoder
    placed = rows[0].batch
    batch = placed[0] if placed is not None else None
    if batch is None or not batch.serves(rows):
        # Rows of `company` that will take turns with these join the batch now, or each turn would rebuild it.
        others = [c for c in company if c not in rows and not c.done and c.feeds_last_token]
        batch = RowBatch.build(rows + others, dec)
    logits = batch.logits(dec)
    slots = [r.batch[1] for r in rows]
    for r in rows:
        r.fed += 1
    mine = logits if slots == list(range(len(batch.rows))) else logits[mx.array(slots)]
    return [logits[s:s + 1] for s in slots], [None] * len(rows), mine


def step_rows(model: Any, rows: list[DecodeRow], feed: int | None = None,
              company: Sequence[DecodeRow] = ()) -> Forward:
    """One packed forward of every unfinished row: each feeds its unfed tokens (at most `feed`; None: all) and
    the rows fed to their end sample one token. Evaluates it here. Engine thread only. Raises what MLX raises."""
    import mlx.core as mx

    live = [r for r in rows if not r.done]
    if not live:
        return Forward(0, 0, False)
    before = sum(r.fed for r in live)
    last, sot, together = _forward(model, live, feed, company)
    fed = sum(r.fed for r in live) - before
    sampling = [(r, logits) for r, logits in zip(live, last) if logits is not None]
    completed = []  # each row's done flag
    drawn = None  # or all rows' tokens at once, when they sampled together
    if together is not None and can_sample_together(live):
        drawn = sample_together(live, together)
    else:
        for r, logits in sampling:
            for f in r.task.logit_filters:
                logits = f.apply(logits, r.tokens)
            r.tokens, done, r.sum_logprobs = r.task.decoder.update(r.tokens, logits, r.sum_logprobs)
            r.keep(r.task.decoder.logprob, 0)
            completed.append(done)
    no_speech: dict[int, Any] = {id(r): mx.softmax(s, axis=-1)[0, r.task.tokenizer.no_speech]
                                 for r, s in zip(live, sot) if s is not None and r.task.tokenizer.no_speech is not None}
    mx.eval([r.tokens for r, _ in sampling] if drawn is None else [drawn.tokens],
            [r.sum_logprobs for r, _ in sampling], completed, list(no_speech.values()))
    for r in live:
        if id(r) in no_speech:
            r.no_speech_prob = float(no_speech[id(r)].item())
    flags = [t == live[0].task.tokenizer.eot for t in drawn.ids()] if drawn is not None \
        else [d.item() for d in completed]
    for (r, _), done in zip(sampling, flags):
        r.sampled += 1
        r.done = bool(done) or r.sampled >= r.task.sample_len or r.length > r.task.n_ctx
        if r.done:  # a finished row's keys are never read again: its batch (or its own cache) can go
            r.batch, r.kv = None, [None] * len(r.kv)
    return Forward(fed, len(sampling), bool(sampling) or bool(no_speech))


def advance_rows(model: Any, rows: list[DecodeRow], tokens: int) -> None:
    """Advance every unfinished row by up to `tokens` sampled tokens (one packed forward each, prompts fed
    whole); rows that finish drop out. Evaluates each forward here. Engine thread only. Raises what MLX raises."""
    for _ in range(max(1, tokens)):
        if step_rows(model, rows).tokens == 0:
            return


def finish_row(row: DecodeRow) -> RowResult:
    """The result of a finished row, scored as mlx-whisper's DecodingTask.run scores it, with its sampled tokens' log
    probabilities where it kept them (one read of them all). Raises what MLX raises (reading those)."""
    import mlx.core as mx
    from mlx_whisper.decoding import compression_ratio

    task = row.task
    eot = task.tokenizer.eot
    sampled = list(row.context[task.sample_begin:])
    if eot in sampled:
        sampled = sampled[: sampled.index(eot)]
    text = task.tokenizer.decode(sampled).strip()
    total = float(row.sum_logprobs.item())
    logprobs = None
    if row.logprobs is not None:  # a step's array for each sampled token (the one after them drew the EOT)
        kept = [a[i:i + 1] for a, i in row.logprobs[:len(sampled)]]
        values: Any = mx.concatenate(kept).tolist() if kept else []
        logprobs = tuple(float(x) for x in values)
    return RowResult(tokens=row.prefix + sampled, sampled=sampled, text=text,
                     avg_logprob=total / (len(sampled) + 1), no_speech_prob=row.no_speech_prob,
                     temperature=row.temperature, compression_ratio=compression_ratio(text), logprobs=logprobs)

