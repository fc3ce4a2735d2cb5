"""Forward passes over mlx-lm model modules with per-row KV caches.

`PackedRunner` (llama-family layers: q/k/v/o + RoPE + optional q/k norm + MLP) concatenates every
row's tokens — decode rows (one token) and prefill chunks alike — into one token matrix: embeddings,
norms, every linear layer and the MLP run once over it. Decode rows whose KV lives in the runner's
`SlotKV` (`Segment.slot`) are written and attended together: one scatter and one attention call per layer
whatever the number of rows. Prefill chunks (and rows still on per-row caches) split RoPE offsets, the KV
update and attention per row against that row's own cache. `SeparateRunner` is the fallback for any other
architecture: one `model(x, cache=...)` call per row.

Both return logits only for the segments that asked for them (the last token of a decode row, and of a
prefill chunk that completes its prompt); a chunk scoring its prompt gets every position's through its `score`
(engine/prompt_scores.py), a block at a time. Nothing here evaluates: the caller runs one `mx.eval` per
iteration over the sampled tokens and the touched caches.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import mlx.core as mx
import mlx.nn as nn

from engine.compiled_decode import CompiledDecode, compile_enabled, compile_forced
from engine.fused import FusedLinear, fused_mlp, heads
from engine.slots import DecodeBatch, SlotKV

if TYPE_CHECKING:
    from engine.lane import DecodeFirst
    from engine.prompt_scores import LogitsOf

__all__ = ["Segment", "Runner", "PackedRunner", "SeparateRunner", "packed_support", "make_cache", "PACKED_MODEL_TYPES"]

# Model types whose decoder layers share llama's q/k/v/o + rope (+ q/k norm) + MLP structure.
PACKED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


@dataclass
class Segment:
    """One row's share of an iteration: `tokens` appended to `cache` (or to slot `slot` of the runner's
    SlotKV: one token, logits); `logits` asks for the last position's."""

    tokens: Sequence[int]
    cache: list[Any] | None
    logits: bool
    slot: int | None = None  # a decode row whose KV lives in the runner's SlotKV (then `cache` is unused)
    # Lazy input tokens (not read yet). Either every slot segment shares one (slot segments,) array in slot
    # order — a decode step, or the decode rows of a mixed step — or a slot segment has its own (1,) array.
    fed: mx.array | None = None
    # A prompt chunk whose every position's logits are asked for (engine/prompt_scores.py): given a LogitsOf over
    # its positions, lazily, after the forward.
    score: Callable[[LogitsOf], None] | None = None

    def layer(self, li: int) -> Any:
        """Layer `li` of this segment's per-row cache. Raises ValueError for a slot segment (no cache)."""
        if self.cache is None:
            raise ValueError("a slot segment has no per-row cache")
        return self.cache[li]

    @property
    def slot_index(self) -> int:
        """The slot of a slot segment. Raises ValueError for a per-row-cache segment."""
        if self.slot is None:
            raise ValueError("not a slot segment")
        return self.slot


class Runner(Protocol):
    def forward(self, segments: Sequence[Segment]) -> mx.array | None:
        """Run the segments; return (number of segments with logits=True, vocab) logits, or None if none asked."""
        ...


def make_cache(model: nn.Module) -> list[Any]:
    """A fresh per-layer KV cache list for one row (mlx-lm's own cache types). Raises nothing."""
    from mlx_lm.models.cache import make_prompt_cache

    return make_prompt_cache(model)


def _inner(model: nn.Module) -> Any:
    return getattr(model, "model", None)


def packed_support(model: nn.Module) -> tuple[bool, str]:
    """Whether `PackedRunner` can drive this model, with a human reason either way. Raises nothing."""
    from mlx_lm.models.cache import KVCache

    model_type = getattr(model, "model_type", None) or getattr(getattr(model, "args", None), "model_type", "?")
    if model_type not in PACKED_MODEL_TYPES:
        return False, f"model_type {model_type} has no packed runner: separate passes"
    inner = _inner(model)
    if inner is None or not all(hasattr(inner, n) for n in ("embed_tokens", "layers", "norm")):
        return False, f"{model_type}: unexpected module layout: separate passes"
    for layer in inner.layers:
        attn = getattr(layer, "self_attn", None)
        needed = ("q_proj", "k_proj", "v_proj", "o_proj", "rope", "n_heads", "n_kv_heads", "scale")
        if attn is None or not all(hasattr(attn, n) for n in needed):
            return False, f"{model_type}: attention without q/k/v/o + rope: separate passes"
        if not all(hasattr(layer, n) for n in ("mlp", "input_layernorm", "post_attention_layernorm")):
            return False, f"{model_type}: layer without mlp/norms: separate passes"
        if getattr(layer, "use_sliding", False):
            return False, f"{model_type}: sliding-window layers: separate passes"
    if not all(type(c) is KVCache for c in make_cache(model)):
        return False, f"{model_type}: non-standard KV cache: separate passes"
    return True, f"{model_type} layers: packed runner available"


def _vector_rope(rope: Any) -> bool:
    """RoPE modules that pass `offset` straight to mx.fast.rope accept one offset per token."""
    from mlx_lm.models import rope_utils

    kinds = tuple(
        k for k in (nn.RoPE, getattr(rope_utils, "Llama3RoPE", None), getattr(rope_utils, "YarnRoPE", None),
                    getattr(rope_utils, "SuScaledRoPE", None)) if k is not None
    )
    return isinstance(rope, kinds)


class PackedRunner:
    """One packed forward for mixed decode + prefill rows of a llama-family model."""

    def __init__(self, model: nn.Module) -> None:
        ok, reason = packed_support(model)
        if not ok:
            raise ValueError(reason)
        self.model = model
        self.inner = _inner(model)
        self.layers = list(self.inner.layers)
        attn = self.layers[0].self_attn
        self.vector_rope = _vector_rope(attn.rope)
        args = getattr(model, "args", None)
        tied = getattr(args, "tie_word_embeddings", not hasattr(model, "lm_head"))
        self.lm_head = self.inner.embed_tokens.as_linear if tied or not hasattr(model, "lm_head") else model.lm_head
        # Batched decode needs one RoPE offset per token; other RoPE kinds keep per-row caches.
        self.slots: SlotKV | None = SlotKV(len(self.layers), heads_per_kv=attn.n_heads // attn.n_kv_heads) \
            if self.vector_rope else None
        # One matmul for q/k/v and one for gate/up per layer (same weight memory; see engine/fused.py).
        self.qkv = [FusedLinear([la.self_attn.q_proj, la.self_attn.k_proj, la.self_attn.v_proj]) for la in self.layers]
        self.mlps = [fused_mlp(la.mlp) for la in self.layers]
        # Decode-only steps, compiled per shape (engine/compiled_decode.py).
        self.compiled = CompiledDecode(self, self.slots, gather=compile_forced()) \
            if self.slots is not None and compile_enabled() else None
        self.turns: DecodeFirst | None = None  # set by a group with a prefill lane (engine/lane.py)

    def forward(self, segments: Sequence[Segment]) -> mx.array | None:
        """Packed forward; see module doc. With `turns` (the prefill lane's DecodeFirst), a decode thread's build
        goes first and the lane's waits between layers. Raises ValueError on an empty segment list."""
        if self.turns is None:
            return self._forward(segments)
        with self.turns.decoding():
            return self._forward(segments)

    def _forward(self, segments: Sequence[Segment]) -> mx.array | None:
        if not segments:
            raise ValueError("no segments")
        # Slot order: with no free slot in between, attention needs no gather (logits keep segment order).
        slotted = sorted((seg for seg in segments if seg.slot is not None), key=lambda seg: seg.slot_index)
        slots = self.slots
        if slotted and (slots is None or any(len(seg.tokens) != 1 or not seg.logits for seg in slotted)):
            raise ValueError("slot segments need a SlotKV runner and one token with logits each")
        # Slot (decode) rows first: their tokens form one block attended in one call per layer.
        order = slotted + [seg for seg in segments if seg.slot is None]
        fed = slotted[0].fed if slotted else None
        # One array feeds every slot segment (one op instead of a slice per row).
        shared = fed is not None and fed.size == len(slotted) and all(seg.fed is fed for seg in slotted)
        if any(seg.fed is not None and seg.slot is None for seg in segments):
            raise ValueError("lazy tokens need slot segments")
        if not shared and any(seg.fed is not None and seg.fed.size != 1 for seg in slotted):
            raise ValueError("lazy tokens: one array of all slot segments' tokens, or a (1,) array each")
        # A decode-only step over slots runs compiled where that serves (planned with stand-in rows).
        compiled = self.compiled if (self.compiled is not None and bool(slotted) and len(slotted) == len(segments)
                                     and self.compiled.serves()) else None
        batch = slots.plan([seg.slot_index for seg in slotted], pad=compiled is not None) \
            if slotted and slots is not None else None
        flat: list[int] = []
        bounds: list[tuple[int, int]] = []
        positions: list[int] = []
        last: dict[int, int] = {}
        for seg in order:
            start = len(flat)
            flat.extend(seg.tokens)
            bounds.append((start, len(flat)))
            off = slots.length(seg.slot) if seg.slot is not None and slots is not None else seg.layer(0).offset
            positions.extend(range(off, off + len(seg.tokens)))
            last[id(seg)] = len(flat) - 1
        picks = [last[id(seg)] for seg in segments if seg.logits]
        T = len(flat)
        if shared and fed is not None:
            rest_ids = flat[len(slotted):]
            ids = fed if not rest_ids else mx.concatenate([fed.astype(mx.int32), mx.array(rest_ids, mx.int32)])
        else:
            ids = _token_ids(order, flat, bounds)
        if compiled is not None and batch is not None and slots is not None:
            logits = compiled.run(ids, [seg.slot_index for seg in slotted], batch)
            slots.commit([seg.slot_index for seg in slotted])
            return logits if picks == list(range(T)) else logits[mx.array(picks)]
        pos = mx.array(positions) if self.vector_rope and len(segments) > 1 else None
        h = self.inner.embed_tokens(ids[None])
        rest = order[len(slotted):]
        # One causal mask per prompt chunk for every layer: the attention fallback (no fused prefill kernel
        # on CUDA without cuDNN) otherwise builds it again in each layer, three kernels each time.
        masks = {id(seg): _causal_mask(seg.layer(0).offset, len(seg.tokens)) for seg in rest if len(seg.tokens) > 1}
        for li, layer in enumerate(self.layers):
            if self.turns is not None:
                self.turns.yield_to_decode()
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            if batch is None or slots is None:
                o = self._attention(attn, self.qkv[li], x, rest, bounds, pos, li, T, masks)
            else:
                q, k, v = heads(attn, self.qkv[li], x, T, pos if pos is not None else batch.first_offset)
                o = self._attention_slots(slots, attn, q, k, v, rest, bounds, li, T, batch, masks)
            h = h + attn.o_proj(o)
            h = h + self.mlps[li](layer.post_attention_layernorm(h))
        if slotted and slots is not None:
            slots.commit([seg.slot_index for seg in slotted])
        for seg, (s, _) in zip(order, bounds):
            if seg.score is not None:  # its positions' logits a block at a time, never the chunk's at once
                seg.score(partial(self._block_logits, h, s))
        if not picks:
            return None
        h = h[:, mx.array(picks)] if picks != list(range(T)) else h
        return self.lm_head(self.inner.norm(h))[0]

    def _block_logits(self, h: mx.array, start: int, a: int, b: int) -> mx.array:
        """The logits of positions [a, b) of the segment whose hidden states start at `start` of `h`. Lazy."""
        return self.lm_head(self.inner.norm(h[:, start + a : start + b]))[0]

    def _attention(self, attn: Any, proj: FusedLinear, x: mx.array, segments: Sequence[Segment],
                   bounds: list[tuple[int, int]], pos: mx.array | None, li: int, T: int,
                   masks: dict[int, mx.array]) -> mx.array:
        if len(segments) == 1:
            return self._attention_one(attn, proj, x, segments[0].layer(li), T)
        # (T, heads, 1, hd): each token its own "batch" entry, so RoPE takes one offset per token (without `pos`,
        # a RoPE kind that takes no per-token offsets, each segment is rotated below); then (1, heads, T, hd).
        q, k, v = (a.transpose(2, 1, 0, 3) for a in heads(attn, proj, x, T, pos))
        outs = []
        for seg, (s, e) in zip(segments, bounds):
            cache = seg.layer(li)
            qs, ks, vs = q[:, :, s:e], k[:, :, s:e], v[:, :, s:e]
            if pos is None:
                qs = attn.rope(qs, offset=cache.offset)
                ks = attn.rope(ks, offset=cache.offset)
            ks, vs = cache.update_and_fetch(ks, vs)
            outs.append(mx.fast.scaled_dot_product_attention(qs, ks, vs, scale=attn.scale,
                                                             mask=_chunk_mask(masks, seg, e - s, ks)))
        o = outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=2)
        return o.transpose(0, 2, 1, 3).reshape(1, T, -1)

    def _attention_slots(self, slots: SlotKV, attn: Any, q: mx.array, k: mx.array, v: mx.array,
                         rest: Sequence[Segment], bounds: list[tuple[int, int]], li: int, T: int,
                         batch: DecodeBatch, masks: dict[int, mx.array]) -> mx.array:
        # Tokens 0..B-1 are the decode rows (one slot each); the rest are per-row prefill chunks.
        B = batch.rows
        qb, kb, vb = (q, k, v) if B == T else (q[:B], k[:B], v[:B])
        o = slots.attend(li, qb, kb, vb, attn.scale, batch)
        outs = [o.transpose(2, 1, 0, 3)]
        if rest:
            qr = q[B:].transpose(2, 1, 0, 3)
            kr = k[B:].transpose(2, 1, 0, 3)
            vr = v[B:].transpose(2, 1, 0, 3)
            for seg, (s, e) in zip(rest, bounds[B:]):
                a, b = s - B, e - B
                # One prompt chunk (the usual mixed step) takes the whole block: three ops fewer per layer.
                qs, kn, vn = (qr, kr, vr) if len(rest) == 1 else (qr[:, :, a:b], kr[:, :, a:b], vr[:, :, a:b])
                ks, vs = seg.layer(li).update_and_fetch(kn, vn)
                outs.append(mx.fast.scaled_dot_product_attention(
                    qs, ks, vs, scale=attn.scale, mask=_chunk_mask(masks, seg, e - s, ks)))
        o = outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=2)
        return o.transpose(0, 2, 1, 3).reshape(1, T, -1)

    @staticmethod
    def _attention_one(attn: Any, proj: FusedLinear, x: mx.array, cache: Any, T: int) -> mx.array:
        # One row: mlx-lm's own layout and op count (no per-token RoPE, no slicing); with a fused projection, q's
        # and k's heads are views of it rotated by one RoPE call.
        nh, nkv = attn.n_heads, attn.n_kv_heads
        if proj.fused and not hasattr(attn, "q_norm"):
            y = proj.project(x).reshape(1, T, nh + 2 * nkv, -1).transpose(0, 2, 1, 3)
            qk = attn.rope(y[:, : nh + nkv], offset=cache.offset)
            q, k, v = qk[:, :nh], qk[:, nh:], y[:, nh + nkv :]
        else:
            qkv = proj(x)
            q = qkv[0].reshape(1, T, nh, -1)
            k = qkv[1].reshape(1, T, nkv, -1)
            v = qkv[2].reshape(1, T, nkv, -1).transpose(0, 2, 1, 3)
            if hasattr(attn, "q_norm"):
                q = attn.q_norm(q)
                k = attn.k_norm(k)
            q = attn.rope(q.transpose(0, 2, 1, 3), offset=cache.offset)
            k = attn.rope(k.transpose(0, 2, 1, 3), offset=cache.offset)
        k, v = cache.update_and_fetch(k, v)
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=attn.scale, mask="causal" if T > 1 else None)
        return o.transpose(0, 2, 1, 3).reshape(1, T, -1)


def _positions(logits: mx.array, a: int, b: int) -> mx.array:
    """Rows [a, b) of a segment's (positions, vocab) logits. Lazy. Raises nothing."""
    return logits[a:b]


def _causal_mask(offset: int, n: int) -> mx.array:
    """(n, offset + n) bool: query i (at position offset + i) sees keys 0..offset + i, as mask="causal"."""
    return mx.arange(offset, offset + n)[:, None] >= mx.arange(offset + n)[None]


def _chunk_mask(masks: dict[int, mx.array], seg: Segment, n: int, keys: mx.array) -> mx.array | str | None:
    """The chunk's precomputed mask when it matches the keys the cache returned (else "causal"); None for one
    token, which sees every key."""
    if n <= 1:
        return None
    mask = masks.get(id(seg))
    return mask if mask is not None and mask.shape[-1] == keys.shape[2] else "causal"


def _token_ids(order: Sequence[Segment], flat: list[int], bounds: list[tuple[int, int]]) -> mx.array:
    """The packed token ids: `flat` as given, with each segment's own lazy token in its place."""
    if all(seg.fed is None for seg in order):
        return mx.array(flat)
    parts: list[mx.array] = []
    run_start = 0  # start of the current run of given (not lazy) tokens
    for seg, (s, e) in zip(order, bounds):
        if seg.fed is not None:
            if s > run_start:
                parts.append(mx.array(flat[run_start:s]))
            parts.append(seg.fed.reshape(1).astype(mx.int32))
            run_start = e
    if run_start < len(flat):
        parts.append(mx.array(flat[run_start:]))
    return mx.concatenate(parts)


class SeparateRunner:
    """Fallback: one model call per segment against that row's cache (any mlx-lm architecture)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def forward(self, segments: Sequence[Segment]) -> mx.array | None:
        """One pass per segment. Raises ValueError on an empty segment list."""
        if not segments:
            raise ValueError("no segments")
        rows = []
        for seg in segments:
            out = self.model(mx.array(list(seg.tokens))[None], cache=seg.cache)
            if seg.score is not None:
                seg.score(partial(_positions, out[0]))
            if seg.logits:
                rows.append(out[0, -1:])
        if not rows:
            return None
        return rows[0] if len(rows) == 1 else mx.concatenate(rows, axis=0)
