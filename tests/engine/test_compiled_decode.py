"""Compiled decode steps: the same logits and KV as the built step, across buffer growth, holes, rows joining and
leaving; a shape is compiled only once it repeats, and only `KEEP` shapes stay compiled."""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import pytest
from mlx_lm.utils import load

from engine import compiled_decode
from engine.runner import PackedRunner, Segment, SeparateRunner
from tests.engine.test_slots import check_schedule, prefill, prompt_of
from tests.fixtures.tiny_llm import build_tiny_llm


@pytest.fixture
def compiled_on(monkeypatch):
    monkeypatch.setenv("TANDEM_DECODE_COMPILE", "on")


@pytest.fixture
def runners(monkeypatch) -> list[PackedRunner]:
    """Every PackedRunner built during the test (check_schedule builds its own)."""
    built: list[PackedRunner] = []
    real_init = PackedRunner.__init__

    def init(self, model):
        real_init(self, model)
        built.append(self)

    monkeypatch.setattr(PackedRunner, "__init__", init)
    return built


def test_on_by_default_only_on_cuda(tiny_loaded, monkeypatch) -> None:
    monkeypatch.delenv("TANDEM_DECODE_COMPILE", raising=False)
    cuda = mx.default_device().type == mx.DeviceType.gpu and mx.cuda.is_available()
    assert (PackedRunner(tiny_loaded.model).compiled is not None) == cuda
    monkeypatch.setenv("TANDEM_DECODE_COMPILE", "off")
    assert PackedRunner(tiny_loaded.model).compiled is None


def test_without_the_decode_kernel_steps_are_built_unless_forced(tiny_loaded, monkeypatch) -> None:
    # Without the kernel a compiled step gathers each row's whole slot a layer: only when asked for by name.
    from engine.slots import SlotKV

    model = tiny_loaded.model
    monkeypatch.setattr("engine.runner.compile_enabled", lambda: True)  # as on CUDA
    monkeypatch.setattr(SlotKV, "uses_kernel", lambda self: False)  # its self-test failed
    for forced, compiled in (("auto", False), ("on", True)):
        monkeypatch.setenv("TANDEM_DECODE_COMPILE", forced)
        runner = PackedRunner(model)
        s = runner.slots.adopt(prefill(runner, model, prompt_of(5, 1)))
        for t in range(3):
            mx.eval(runner.forward([Segment([9 + t], None, True, s)]))
        assert runner.compiled is not None and (runner.compiled.traces > 0) == compiled


def test_compiled_schedule_matches_per_row_caches_llama(tiny_loaded, compiled_on, runners) -> None:
    check_schedule(tiny_loaded.model)
    assert runners[0].compiled is not None and runners[0].compiled.traces >= 1  # the repeated steps ran compiled


def test_compiled_schedule_matches_per_row_caches_qwen3(tmp_path, compiled_on) -> None:
    model, _ = load(str(build_tiny_llm(tmp_path, model_type="qwen3")))  # q/k norms inside the compiled step
    check_schedule(model)


def test_compiled_steps_write_the_same_kv_across_growth(tiny_loaded, compiled_on) -> None:
    model = tiny_loaded.model
    runner = PackedRunner(model)
    runner.slots.step = 4  # the capacity grows every few tokens: new shapes, compiled once each repeats
    prompts = [prompt_of(6, 1), prompt_of(3, 2)]
    slots = [runner.slots.adopt(prefill(runner, model, p)) for p in prompts]
    fed = [[], []]
    for t in range(11):
        ids = [[30 + t], [50 + t]]
        mx.eval(runner.forward([Segment(ids[i], None, True, s) for i, s in enumerate(slots)]))
        for i in range(2):
            fed[i] += ids[i]
    assert runner.compiled is not None and runner.compiled.traces >= 2
    for i, s in enumerate(slots):
        ref = prefill(SeparateRunner(model), model, prompts[i] + fed[i])
        n = len(prompts[i]) + len(fed[i])
        for a, b in zip(runner.slots.export(s), ref):
            assert a.offset == b.offset == n
            assert mx.allclose(a.keys, b.keys[..., :n, :], atol=1e-4).item()
            assert mx.allclose(a.values, b.values[..., :n, :], atol=1e-4).item()


def test_a_shape_is_compiled_once_it_repeats_and_only_keep_stay(tiny_loaded, compiled_on, monkeypatch) -> None:
    model = tiny_loaded.model
    runner = PackedRunner(model)
    compiled = runner.compiled
    assert compiled is not None
    slots = [runner.slots.adopt(prefill(runner, model, prompt_of(4 + i, i))) for i in range(3)]
    traced: list[tuple] = []
    real_compile = mx.compile
    monkeypatch.setattr(compiled_decode.mx, "compile", lambda fn: traced.append(1) or real_compile(fn))

    def step(live: list[int], t: int) -> None:
        mx.eval(runner.forward([Segment([9 + t], None, True, slots[i]) for i in live]))

    for t in range(4):  # the row count alternates: no shape repeats, so nothing is compiled
        step([0, 1] if t % 2 else [0], t)
    assert compiled.traces == 0 and not traced
    step([0, 1, 2], 4)
    step([0, 1, 2], 5)  # the second step in a row of this shape compiles it
    step([0, 1, 2], 6)  # and the third reuses it
    assert compiled.traces == 1 and len(traced) == 1
    monkeypatch.setattr(compiled_decode, "KEEP", 1)
    step([0, 1], 7)
    step([0, 1], 8)
    assert compiled.traces == 2 and len(compiled._compiled) == 1  # the older shape was let go


def test_rows_joining_and_leaving_within_the_slots_keep_one_compiled_shape(tiny_loaded, compiled_on) -> None:
    # Rows in the free slots fill each step to the buffers' slots: under varied arrivals every new row count was a
    # new shape, run built once and traced the next step (3-6 ms a trace on the H200, ~40 under poisson8).
    model = tiny_loaded.model
    runner = PackedRunner(model)
    compiled = runner.compiled
    assert compiled is not None
    held = [runner.slots.adopt(prefill(runner, model, prompt_of(4 + i, i))) for i in range(3)]  # 4 slots

    def steps(n: int) -> None:
        for t in range(n):
            mx.eval(runner.forward([Segment([9 + t], None, True, s) for s in held]))

    steps(3)
    held.append(runner.slots.adopt(prefill(runner, model, prompt_of(6, 7))))  # a row joins: 4 of 4
    steps(3)
    runner.slots.release(held.pop(1))  # a row leaves a hole: 3 of 4
    steps(2)
    runner.slots.release(held.pop(0))
    steps(2)
    assert runner.slots.slots == 4 and compiled.traces == 1  # one shape: 4 rows, 4 slots, one capacity


@pytest.mark.anyio
async def test_the_engine_serves_compiled_steps_and_stats_count_their_traces(tiny_loaded, compiled_on) -> None:
    import anyio

    from engine.contracts import GenerationRequest
    from engine.runtime import Engine
    from tests.engine.test_runtime import GREEDY, reference

    engine = Engine(tiny_loaded, memory_budget=1 << 30)
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        prompt = prompt_of(7, 4)
        async with engine.submit(GenerationRequest(prompt, GREEDY, max_tokens=24)) as stream:
            got = [t async for d in stream for t in d.token_ids]
        stats = engine.stats()["compiled_decode"]
        engine.close()
    assert got == reference(tiny_loaded.model, prompt, 24)
    assert stats["on"] and stats["traces"] >= 1 and stats["trace_seconds"] > 0
    assert stats["fused_steps"] == 0  # the fused kernels are CUDA's: none served here


def test_steps_of_few_rows_fold_norms_adds_and_swiglu_into_the_kernels(tmp_path, compiled_on, runners,
                                                                       stand_in_kernels) -> None:
    # The kernels run on CUDA only; here MLX's own ops stand in for them, so what this checks is the wiring (which
    # norm, weight and residual each kernel gets): every logit still equals mlx-lm's per-row forward.
    from engine import fused_gemv

    calls = stand_in_kernels
    model, _ = load(str(build_tiny_llm(tmp_path)))
    norms = [n for la in model.model.layers for n in (la.input_layernorm, la.post_attention_layernorm)]
    for i, norm in enumerate([*norms, model.model.norm]):  # norms as trained ones are: no two alike (init: ones)
        norm.weight = 1 + 0.5 * mx.random.normal(norm.weight.shape, key=mx.random.key(i))

    check_schedule(model)
    kinds = Counter(name for name, _ in calls)
    layers = len(model.model.layers)
    compiled = runners[0].compiled
    # Python runs the step on a shape's first step and as it traces: every such call is a fused step, compiled ones too.
    assert compiled is not None and compiled.fused_steps >= kinds["norm_swiglu"] // layers
    assert kinds["norm_swiglu"] and kinds["project_add"] == 2 * kinds["norm_swiglu"]
    assert kinds["norm_project"] == kinds["norm_swiglu"] * (layers + 1) // layers  # the output projection's too
    assert max(rows for _, rows in calls) <= fused_gemv.MAX_ROWS


def test_models_the_kernels_cannot_fold_keep_the_built_layers(tmp_path) -> None:
    model, _ = load(str(build_tiny_llm(tmp_path, model_type="qwen3")))  # q/k norms between projection and RoPE
    assert compiled_decode._plain_llama(PackedRunner(model)) is None


def test_a_llama_model_is_folded_with_its_widths_and_output_projection(tiny_loaded) -> None:
    model = tiny_loaded.model
    runner = PackedRunner(model)
    assert compiled_decode._plain_llama(runner) == (model.args.hidden_size, model.args.intermediate_size)
    want = model.model.embed_tokens.weight if model.args.tie_word_embeddings else model.lm_head.weight
    assert compiled_decode._lm_weight(runner) is want

