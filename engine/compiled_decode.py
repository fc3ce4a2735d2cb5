"""Decode-only steps over slot rows as one `mx.compile`d function per shape.

A decode step of a small model is host work: at one row on the H200 the device needs ~0.5 ms for the weights
and the engine spends ~2.4 ms building and launching ~270 kernels a token. Compiled, the step is a tape replayed
in C++ with its elementwise chains fused. MLX traces a compiled function per input shape, and a decode step's
shapes are its rows, the slot buffers' slots and their capacity: fixed between row changes and buffer growths
when the step attends through each row's own length (engine/decode_attention.py's kernel; elsewhere a mask over
the whole capacity). The slot writes are part of the function: its inputs are the buffers, its outputs the
buffers written. Rows in the free slots fill a step to all the slots (SlotKV.plan(pad=True)), so rows joining
and leaving keep its shape: under Poisson arrivals each new row count was a new trace. A shape is compiled the
second step in a row it is seen (rows that join and leave at once would each cost a trace) and the last `KEEP`
shapes stay compiled. On by default on CUDA (`TANDEM_DECODE_COMPILE` = on | off | auto).
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import mlx.core as mx

from engine import decode_attention, fused_gemv
from engine.accelerator import on_gpu
from engine.fused import heads, projected_heads

if TYPE_CHECKING:
    from engine.slots import DecodeBatch, SlotKV

__all__ = ["CompiledDecode", "compile_enabled", "compile_forced", "KEEP"]

KEEP = 32  # compiled shapes kept (each holds a trace of the step; evicting one frees it)

Shape = tuple[int, int, int]  # (rows, slots, capacity)


class ModelParts(Protocol):
    """What the step reads of engine/runner.py's PackedRunner: the model's modules and its fused projections."""

    inner: Any  # the model's inner module: embed_tokens, norm
    layers: list[Any]
    qkv: list[Any]  # per layer: x → [q, k, v]
    mlps: list[Any]  # per layer: x → MLP(x)
    lm_head: Any


def _choice() -> str:
    return os.environ.get("TANDEM_DECODE_COMPILE", "auto").lower()


def compile_forced() -> bool:
    """Whether TANDEM_DECODE_COMPILE=on asks for compiled steps also without the decode kernel. Raises nothing."""
    return _choice() == "on"


def compile_enabled() -> bool:
    """Whether decode-only steps run compiled: TANDEM_DECODE_COMPILE=on|off, else on CUDA, where the decode kernel
    reads each row's own length. Elsewhere (Metal, a CPU) the compiled step would gather every row's whole slot
    a layer, where the built one attends slices of the buffers. Raises nothing."""
    choice = _choice()
    if choice in ("on", "off"):
        return choice == "on"
    return on_gpu() and mx.cuda.is_available()


class CompiledDecode:
    """The runner's decode-only step, compiled per shape (see module doc). Used on the engine thread only: MLX keeps
    compiled traces per thread."""

    def __init__(self, runner: ModelParts, slots: SlotKV, gather: bool = False) -> None:
        self.runner = runner
        self.slots = slots
        self.gather = gather  # serve without the decode kernel too (rows' slots gathered: TANDEM_DECODE_COMPILE=on)
        self._compiled: OrderedDict[Shape, Callable[..., Any]] = OrderedDict()
        self._last: Shape | None = None  # the previous decode step's shape
        # (hidden, intermediate) when the fused matrix-vector kernels are asked for and fit its layers
        plain = _plain_llama(runner) if fused_gemv.enabled() else None
        self._plain = plain if plain is not None and fused_gemv.suits(plain[0]) else None
        # the output projection's weight when its norm folds into it too (only looked up where the layers fold)
        self._lm_weight = _lm_weight(runner) if self._plain is not None else None
        self.traces = 0  # shapes compiled so far (tests, bench/step_profile.py)
        self.fused_steps = 0  # steps run through the fused matrix-vector kernels (/stats: whether they serve here)
        self.trace_seconds = 0.0  # host time of the steps that traced a new shape

    def serves(self) -> bool:
        """Whether decode steps run compiled here: with the decode kernel (its self-test passed on CUDA), or when
        forced on. Raises nothing."""
        return self.gather or self.slots.uses_kernel()

    def run(self, ids: mx.array, slot_list: Sequence[int], batch: DecodeBatch) -> mx.array:
        """(rows, vocab) logits for the tokens `ids` (rows,) of the slots in `slot_list` (slot order, as planned in
        `batch`), writing their KV; compiled once the shape repeats. Raises what MLX raises."""
        slots = self.slots
        row_slots = batch.row_slots if batch.row_slots is not None else mx.array(list(slot_list), dtype=mx.int32)
        rows = len(slot_list)
        ids = ids.astype(mx.int32)
        if batch.padded:  # rows standing in free slots: token 0 (their outputs are dropped below)
            ids = mx.concatenate([ids, mx.zeros((batch.padded,), mx.int32)])
        shape = (rows + batch.padded, slots.slots, slots.capacity)
        if self._folds(shape[0]):  # its self-test runs here, outside any trace
            self.fused_steps += 1
        traces = self.traces
        fn = self._function(shape)
        t0 = time.perf_counter()
        out = fn(ids, batch.offsets, batch.scatter_slot, batch.scatter_head, batch.scatter_pos,
                 row_slots, *slots.keys, *slots.values)
        if self.traces > traces:
            self.trace_seconds += time.perf_counter() - t0
        n = slots.n_layers
        slots.keys, slots.values = list(out[1:1 + n]), list(out[1 + n:])
        return out[0][:rows] if batch.padded else out[0]

    def _function(self, shape: Shape) -> Callable[..., Any]:
        fn = self._compiled.get(shape)
        if fn is not None:
            self._compiled.move_to_end(shape)
        elif shape == self._last:
            fn = self._compiled[shape] = mx.compile(self._step)
            self.traces += 1
            while len(self._compiled) > KEEP:
                self._compiled.popitem(last=False)
        self._last = shape
        return fn if fn is not None else self._step

    def _folds(self, rows: int) -> bool:
        """Whether a step of `rows` rows runs its norms, residual adds and SwiGLU inside the matrix-vector kernels
        (engine/fused_gemv.py). Raises nothing."""
        if self._plain is None:
            return False
        hidden, intermediate = self._plain
        return fused_gemv.available(self.runner.qkv[0].params["weight"].dtype, hidden, intermediate, rows)

    def _step(self, ids: mx.array, offsets: mx.array, s_slot: mx.array, s_head: mx.array, s_pos: mx.array,
              row_slots: mx.array, *kv: mx.array) -> list[mx.array]:
        """The pure step: [logits, keys of every layer..., values of every layer...]; `offsets` (rows,): each row's
        length before this token. Raises what MLX raises."""
        run = self.runner
        n = len(run.layers)
        keys, values = list(kv[:n]), list(kv[n:])
        rows = ids.shape[0]
        kernel = self.slots.uses_kernel()
        row_lengths = (offsets + 1).astype(mx.int32)  # keys each row attends, its new one included
        at = (s_slot, s_head, s_pos)  # (row, kv head), broadcast
        h = run.inner.embed_tokens(ids[None])
        folds = self._folds(rows)
        for li, layer in enumerate(run.layers):
            attn = layer.self_attn
            if folds:
                norm = layer.input_layernorm
                y = fused_gemv.norm_project(h[0], norm.weight, norm.eps, run.qkv[li].params["weight"])
                q, k, v = projected_heads(attn, y, rows, offsets)
            else:
                q, k, v = heads(attn, run.qkv[li], layer.input_layernorm(h), rows, offsets)
            keys[li][at] = k[:, :, 0]  # views of the projection: written without a copy
            values[li][at] = v[:, :, 0]
            if kernel:
                o = decode_attention.attend(q, keys[li], values[li], row_slots, row_lengths, attn.scale)
            else:  # each row's slot, gathered, with the positions past its length masked
                cap = keys[li].shape[2]
                mask = (mx.arange(cap)[None] < row_lengths[:, None])[:, None, None, :]
                o = mx.fast.scaled_dot_product_attention(q, keys[li][row_slots], values[li][row_slots],
                                                         scale=attn.scale, mask=mask)
            if folds:
                mlp, norm = run.mlps[li], layer.post_attention_layernorm
                h1 = fused_gemv.project_add(o.reshape(rows, -1), attn.o_proj.weight, h[0])
                a = fused_gemv.norm_swiglu(h1, norm.weight, norm.eps, mlp.gate_up.params["weight"])
                h = fused_gemv.project_add(a, mlp.down.weight, h1)[None]
                continue
            h = h + attn.o_proj(o.reshape(1, rows, -1))
            h = h + run.mlps[li](layer.post_attention_layernorm(h))
        if folds and self._lm_weight is not None:
            norm = run.inner.norm
            return [fused_gemv.norm_project(h[0], norm.weight, norm.eps, self._lm_weight), *keys, *values]
        return [run.lm_head(run.inner.norm(h))[0], *keys, *values]


def _lm_weight(runner: ModelParts) -> mx.array | None:
    """The output projection's weight, (vocab, hidden), when the final norm and it fold into one kernel: the tied
    embedding's or a plain Linear's, after an RMSNorm. Raises nothing."""
    import mlx.nn as nn

    inner, head = runner.inner, runner.lm_head
    if type(getattr(inner, "norm", None)) is not nn.RMSNorm:
        return None
    if type(inner.embed_tokens) is nn.Embedding and head == inner.embed_tokens.as_linear:
        return inner.embed_tokens.weight
    if type(head) is nn.Linear and "bias" not in head:
        return head.weight
    return None


def _plain_llama(runner: ModelParts) -> tuple[int, int] | None:
    """(hidden, intermediate) when every layer is what the fused matrix-vector kernels fold: RMSNorms, fused q/k/v
    and gate/up projections and plain o/down projections, none quantized or biased, no q/k norms. Raises nothing."""
    import mlx.nn as nn

    def plain(layer: Any) -> bool:
        return type(layer) is nn.Linear and "bias" not in layer

    dims: set[tuple[int, int]] = set()
    for layer, qkv, mlp in zip(runner.layers, runner.qkv, runner.mlps):
        attn, gate_up, down = layer.self_attn, getattr(mlp, "gate_up", None), getattr(mlp, "down", None)
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if not (qkv.fused and not qkv.quantized and "bias" not in qkv.params and not hasattr(attn, "q_norm")
                and gate_up is not None and gate_up.fused and not gate_up.quantized and "bias" not in gate_up.params
                and plain(attn.o_proj) and plain(down) and all(type(n) is nn.RMSNorm for n in norms)):
            return None
        assert down is not None
        dims.add((int(down.weight.shape[0]), int(down.weight.shape[1])))
    return dims.pop() if len(dims) == 1 else None
